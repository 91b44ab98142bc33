/* farctx: method names, parameter defaults and validation */
#include "farctx-impl.h"

#include <string.h>

static const char * const k_method_names[FARCTX_METHOD_COUNT] = {
    [FARCTX_METHOD_VANILLA]     = "vanilla",
    [FARCTX_METHOD_LMINF]       = "lminf",
    [FARCTX_METHOD_WINDOW]      = "window",
    [FARCTX_METHOD_LAMBDA_ONLY] = "lambda-only",
    [FARCTX_METHOD_REROPE]      = "rerope",
    [FARCTX_METHOD_STREAMING]   = "streaming",
    [FARCTX_METHOD_MESA]        = "mesa",
    [FARCTX_METHOD_SELFEXTEND]  = "selfextend",
};

struct farctx_params farctx_default_params(void) {
    struct farctx_params p = {
        .method       = FARCTX_METHOD_VANILLA,
        .n_ctx_train  = 0,   /* the model's */
        .n_global     = 10,
        .n_local      = 0,   /* n_ctx_train */
        .n_sink       = 4,
        .first_chunk  = 100,
        .stair_width  = 50,
        .last_context = 512,
        .gen_budget   = 50,
        .group        = 0,   /* auto */
        .neighbor     = 0,   /* auto */
    };
    return p;
}

const char * farctx_method_name(int32_t method) {
    if (method < 0 || method >= FARCTX_METHOD_COUNT) {
        return NULL;
    }
    return k_method_names[method];
}

int32_t farctx_method_from_name(const char * name) {
    if (name == NULL) {
        return -1;
    }
    for (int32_t m = 0; m < FARCTX_METHOD_COUNT; ++m) {
        if (strcmp(name, k_method_names[m]) == 0) {
            return m;
        }
    }
    return -1;
}

bool farctx_method_available(int32_t method) {
    switch (method) {
        case FARCTX_METHOD_VANILLA:
        case FARCTX_METHOD_LMINF:
        case FARCTX_METHOD_WINDOW:
        case FARCTX_METHOD_LAMBDA_ONLY:
        case FARCTX_METHOD_REROPE:
        case FARCTX_METHOD_STREAMING:
        case FARCTX_METHOD_MESA:
        case FARCTX_METHOD_SELFEXTEND:
            return true;
        default:
            return false;
    }
}

void farctx_params_resolve(struct farctx_params * p, const struct llama_model * model) {
    if (p->n_ctx_train <= 0 && model != NULL) {
        p->n_ctx_train = llama_model_n_ctx_train(model);
    }
    if (p->n_local <= 0) {
        /* streaming: sinks plus window fill the trained context */
        p->n_local = p->method == FARCTX_METHOD_STREAMING ? p->n_ctx_train - p->n_sink : p->n_ctx_train;
    }
    if (p->neighbor <= 0) {
        p->neighbor = p->n_ctx_train / 2;
    }
}

int64_t farctx_params_cache_cells(const struct farctx_params * params, int32_t n_ctx_train, int32_t n_ubatch) {
    if (params == NULL || !farctx_method_fixed_cache(params->method)) {
        return 0;
    }
    struct farctx_params p = *params;
    if (p.n_ctx_train <= 0) {
        p.n_ctx_train = n_ctx_train;
    }
    farctx_params_resolve(&p, NULL);
    return (int64_t) farctx_policy_head(&p) + p.n_local + n_ubatch;
}

int32_t farctx_params_validate(const struct farctx_params * params, const struct llama_model * model,
                               char * err, size_t err_size) {
    if (params == NULL) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "no parameters");
    }
    const char * name = farctx_method_name(params->method);
    if (name == NULL) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "unknown method %d", params->method);
    }

    const struct { const char * what; int32_t value; int32_t min; } fields[] = {
        { "n_ctx_train",  params->n_ctx_train,  0 },
        { "n_global",     params->n_global,     0 },
        { "n_local",      params->n_local,      0 },
        { "n_sink",       params->n_sink,       0 },
        { "first_chunk",  params->first_chunk,  1 },
        { "stair_width",  params->stair_width,  1 },
        { "last_context", params->last_context, 1 },
        { "gen_budget",   params->gen_budget,   0 },
        { "group",        params->group,        0 },
        { "neighbor",     params->neighbor,     0 },
    };
    for (size_t i = 0; i < sizeof(fields)/sizeof(fields[0]); ++i) {
        if (fields[i].value < fields[i].min) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "%s must be >= %d (got %d)",
                               fields[i].what, fields[i].min, fields[i].value);
        }
    }

    if (!farctx_method_available(params->method)) {
        return farctx_fail(err, err_size, FARCTX_ERR_UNSUPPORTED,
                           "method '%s' is not available in this build of farctx", name);
    }

    if (model != NULL) {
        struct farctx_params p = *params;
        farctx_params_resolve(&p, model);
        if (p.n_ctx_train <= 0) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                               "the model does not declare its trained context length: set n_ctx_train");
        }
        if (p.method == FARCTX_METHOD_LMINF && p.n_global >= p.n_local) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                               "n_global (%d) must be smaller than n_local (%d)", p.n_global, p.n_local);
        }
        if (p.method == FARCTX_METHOD_MESA && p.n_ctx_train - 2 * p.first_chunk < 1) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                               "first_chunk (%d) must be below half of n_ctx_train (%d): the chunk width is "
                               "n_ctx_train - 2 first_chunk", p.first_chunk, p.n_ctx_train);
        }
        if (p.method == FARCTX_METHOD_SELFEXTEND && (p.neighbor < 1 || p.neighbor >= p.n_ctx_train)) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                               "neighbor (%d) must be between 1 and n_ctx_train - 1 (%d)", p.neighbor, p.n_ctx_train - 1);
        }
        if (p.n_local < 1) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                               "n_local must be >= 1 (n_ctx_train %d, n_sink %d)", p.n_ctx_train, p.n_sink);
        }
    }

    return farctx_fail(err, err_size, FARCTX_OK, "%s", "");
}

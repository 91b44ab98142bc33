/* farctx: the method table and the parameter table (the one home of every fact about a method), and
 * which models a method can run on */
#include "farctx-impl.h"

#include <stdio.h>
#include <string.h>

#define M(m) (1u << FARCTX_METHOD_##m)
#define ALL_METHODS ((1u << FARCTX_METHOD_COUNT) - 1)
#define NEEDS_ROPE  FARCTX_MODEL_ROPE  /* the methods that change the graph */

static const struct farctx_method_def k_methods[FARCTX_METHOD_COUNT] = {
    [FARCTX_METHOD_VANILLA] = {
        .info = { .name = "vanilla", .help = "full attention at true distances (stock llama.cpp)",
                  .fixed_cache = false, .stock_graph = true, .head_param = -1,
                  .model_kinds = FARCTX_MODEL_ANY, .whole_prompt = false, .stock_inside = true },
        .ops  = &farctx_vanilla_ops },
    [FARCTX_METHOD_LMINF] = {
        .info = { .name = "lminf", .help = "LM-Infinite: global tokens + local window, distances bounded by n_local",
                  .fixed_cache = true, .stock_graph = false, .head_param = FARCTX_PARAM_N_GLOBAL,
                  .model_kinds = NEEDS_ROPE, .whole_prompt = false },
        .ops  = &farctx_lminf_ops },
    [FARCTX_METHOD_WINDOW] = {
        .info = { .name = "window", .help = "a sliding window of n_local tokens (ablation)",
                  .fixed_cache = true, .stock_graph = false, .head_param = -1,
                  .model_kinds = NEEDS_ROPE, .whole_prompt = false },
        .ops  = &farctx_window_ops },
    [FARCTX_METHOD_LAMBDA_ONLY] = {
        .info = { .name = "lambda-only", .help = "global tokens + local window at true distances (ablation)",
                  .fixed_cache = true, .stock_graph = false, .head_param = FARCTX_PARAM_N_GLOBAL,
                  .model_kinds = NEEDS_ROPE, .whole_prompt = false },
        .ops  = &farctx_lambda_only_ops },
    [FARCTX_METHOD_REROPE] = {
        .info = { .name = "rerope", .help = "every key, distances capped at n_local",
                  .fixed_cache = false, .stock_graph = false, .head_param = -1,
                  .model_kinds = NEEDS_ROPE, .whole_prompt = false },
        .ops  = &farctx_rerope_ops },
    [FARCTX_METHOD_STREAMING] = {
        .info = { .name = "streaming", .help = "StreamingLLM: sink tokens + a window, positions inside the cache",
                  .fixed_cache = true, .stock_graph = false, .head_param = FARCTX_PARAM_N_SINK,
                  .model_kinds = NEEDS_ROPE, .whole_prompt = false },
        .ops  = &farctx_streaming_ops },
    [FARCTX_METHOD_MESA] = {
        .info = { .name = "mesa", .help = "Mesa-Extrapolation: a chunked prompt, stair positions, log-n query scale",
                  .fixed_cache = false, .stock_graph = false, .head_param = -1,
                  .model_kinds = NEEDS_ROPE, .whole_prompt = true },
        .ops  = &farctx_mesa_ops },
    [FARCTX_METHOD_SELFEXTEND] = {
        .info = { .name = "selfextend", .help = "SelfExtend: a neighbour window, grouped distances beyond it",
                  .fixed_cache = false, .stock_graph = false, .head_param = -1,
                  .model_kinds = NEEDS_ROPE, .whole_prompt = false },
        .ops  = &farctx_selfextend_ops },
    [FARCTX_METHOD_DCA] = {
        .info = { .name = "dca", .help = "Dual Chunk Attention: chunks, every key at a distance of at most chunk_size",
                  .fixed_cache = false, .stock_graph = false, .head_param = -1,
                  .model_kinds = NEEDS_ROPE, .whole_prompt = false },
        .ops  = &farctx_dca_ops },
    [FARCTX_METHOD_STRING] = {
        .info = { .name = "string", .help = "STRING: true distances below shifted_offset, the farther keys shifted "
                                            "back to local_value",
                  .fixed_cache = false, .stock_graph = false, .head_param = -1,
                  .model_kinds = NEEDS_ROPE, .whole_prompt = false },
        .ops  = &farctx_string_ops },
    [FARCTX_METHOD_AUTO] = {
        .info = { .name = "auto", .help = "stock llama.cpp inside the trained context, Dual Chunk Attention past it",
                  .fixed_cache = false, .stock_graph = false, .head_param = -1,
                  .model_kinds = FARCTX_MODEL_ANY, .whole_prompt = false, .stock_inside = true },
        .ops  = &farctx_auto_ops },
};

#define P(field, help, def, min, methods) \
    { #field, help, def, min, methods, offsetof(struct farctx_params, field) }

static const struct farctx_param_info k_params[FARCTX_PARAM_COUNT] = {
    [FARCTX_PARAM_N_CTX_TRAIN]  = P(n_ctx_train,  "trained context to assume (0: the model's)", 0, 0, ALL_METHODS),
    [FARCTX_PARAM_N_GLOBAL]     = P(n_global,     "global tokens G, seen by every query", 10, 0,
                                    M(LMINF) | M(LAMBDA_ONLY)),
    [FARCTX_PARAM_N_LOCAL]      = P(n_local,      "local window L (0: n_ctx_train); streaming: the window with "
                                    "the query (0: n_ctx_train - n_sink)", 0, 0,
                                    M(LMINF) | M(WINDOW) | M(LAMBDA_ONLY) | M(REROPE) | M(STREAMING)),
    [FARCTX_PARAM_N_SINK]       = P(n_sink,       "sink tokens S", 4, 0, M(STREAMING)),
    [FARCTX_PARAM_FIRST_CHUNK]  = P(first_chunk,  "first chunk F", 100, 1, M(MESA)),
    [FARCTX_PARAM_STAIR_WIDTH]  = P(stair_width,  "stair width E", 50, 1, M(MESA)),
    [FARCTX_PARAM_LAST_CONTEXT] = P(last_context, "last context", 512, 1, M(MESA)),
    [FARCTX_PARAM_GEN_BUDGET]   = P(gen_budget,   "generation budget reserved by the split", 50, 0, M(MESA)),
    [FARCTX_PARAM_GROUP]        = P(group,        "group size Gs (0: ceil((n_ctx - W) / (n_ctx_train - W)))", 0, 0,
                                    M(SELFEXTEND)),
    [FARCTX_PARAM_NEIGHBOR]     = P(neighbor,     "neighbour window W (0: n_ctx_train / 2)", 0, 0, M(SELFEXTEND)),
    [FARCTX_PARAM_CHUNK_SIZE]   = P(chunk_size,   "chunk size: the largest distance (0: 3 x n_ctx_train / 4; auto: "
                                    "n_ctx_train)", 0, 0,
                                    M(DCA) | M(AUTO)),
    [FARCTX_PARAM_LOCAL_WINDOW] = P(local_window, "local window: chunks are chunk_size - local_window tokens "
                                    "(0: n_ctx_train / 8)", 0, 0, M(DCA) | M(AUTO)),
    [FARCTX_PARAM_SHIFTED_OFFSET] = P(shifted_offset, "shifted offset S: distances from S on are read S - "
                                      "local_value nearer (0: 0.33 x n_ctx_train)", 0, 0, M(STRING)),
    [FARCTX_PARAM_LOCAL_VALUE]  = P(local_value,  "local value W: where the shifted keys start (0: 128, at most "
                                    "shifted_offset / 2)", 0, 0, M(STRING)),
};

const struct farctx_method_def * farctx_method_def(int32_t method) {
    if (method < 0 || method >= FARCTX_METHOD_COUNT || k_methods[method].info.name == NULL) {
        return NULL;
    }
    return &k_methods[method];
}

int32_t farctx_method_count(void) {
    return FARCTX_METHOD_COUNT;
}

struct farctx_method_info farctx_method_get_info(int32_t method) {
    const struct farctx_method_def * d = farctx_method_def(method);
    if (d == NULL) {
        struct farctx_method_info none = { NULL, NULL, false, false, -1, 0, false, false };
        return none;
    }
    return d->info;
}

const char * farctx_method_name(int32_t method) {
    const struct farctx_method_def * d = farctx_method_def(method);
    return d ? d->info.name : NULL;
}

int32_t farctx_method_from_name(const char * name) {
    for (int32_t m = 0; name != NULL && m < FARCTX_METHOD_COUNT; ++m) {
        if (k_methods[m].info.name != NULL && strcmp(name, k_methods[m].info.name) == 0) {
            return m;
        }
    }
    return -1;
}

bool farctx_method_available(int32_t method) {
    const struct farctx_method_def * d = farctx_method_def(method);
    return d != NULL && d->ops != NULL;
}

bool farctx_method_fixed_cache(int32_t method) {
    const struct farctx_method_def * d = farctx_method_def(method);
    return d != NULL && d->info.fixed_cache;
}

int32_t farctx_param_count(void) {
    return FARCTX_PARAM_COUNT;
}

struct farctx_param_info farctx_param_get_info(int32_t i) {
    if (i < 0 || i >= FARCTX_PARAM_COUNT) {
        struct farctx_param_info none = { NULL, NULL, 0, 0, 0, 0 };
        return none;
    }
    return k_params[i];
}

int32_t farctx_param_get(const struct farctx_params * params, int32_t i) {
    if (params == NULL || i < 0 || i >= FARCTX_PARAM_COUNT) {
        return 0;
    }
    int32_t value;
    memcpy(&value, (const char *) params + k_params[i].offset, sizeof(value));
    return value;
}

bool farctx_param_set(struct farctx_params * params, int32_t i, int32_t value) {
    if (params == NULL || i < 0 || i >= FARCTX_PARAM_COUNT) {
        return false;
    }
    memcpy((char *) params + k_params[i].offset, &value, sizeof(value));
    return true;
}

int32_t farctx_params_head(const struct farctx_params * p) {
    const struct farctx_method_def * d = farctx_method_def(p->method);
    return d != NULL && d->info.head_param >= 0 ? farctx_param_get(p, d->info.head_param) : 0;
}

int32_t farctx_model_kind(const struct llama_model * model, char * why, size_t why_size) {
    if (model == NULL) {
        farctx_fail(why, why_size, 0, "no model");
        return FARCTX_MODEL_OTHER;
    }
    /* llama.cpp decides whether its attention graph can take our mask and positions
     * (patches/0013: the same checks llama_set_attn_extrap makes); the kind below only tells the
     * method table who may still run (vanilla runs any model, on the stock graph) */
    char reason[256];
    if (llama_model_attn_extrap_supported(model, reason, sizeof(reason))) {
        farctx_fail(why, why_size, 0, "%s", "");
        return FARCTX_MODEL_ROPE;
    }
    farctx_fail(why, why_size, 0, "%s", reason);
    if (llama_model_is_recurrent(model) || llama_model_is_hybrid(model)) {
        return FARCTX_MODEL_RECURRENT;
    }
    if (llama_model_n_swa(model) > 0) {
        return FARCTX_MODEL_SWA;
    }
    return FARCTX_MODEL_OTHER;
}

int32_t farctx_method_supported(int32_t method, const struct llama_model * model, char * err, size_t err_size) {
    const struct farctx_method_def * d = farctx_method_def(method);
    if (d == NULL) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "unknown method %d", method);
    }
    if (d->ops == NULL) {
        return farctx_fail(err, err_size, FARCTX_ERR_UNSUPPORTED, "not available in this build of farctx");
    }
    if (model != NULL && (farctx_model_kind(model, err, err_size) & d->info.model_kinds) == 0) {
        return FARCTX_ERR_UNSUPPORTED;  /* the reason is in err */
    }
    return farctx_fail(err, err_size, FARCTX_OK, "%s", "");
}

int32_t farctx_method_for_model(int32_t method, const struct llama_model * model, char * why, size_t why_size) {
    farctx_fail(why, why_size, 0, "%s", "");
    if (method != FARCTX_METHOD_AUTO || model == NULL) {
        return method;
    }
    /* auto's extension changes the graph: it runs where the methods that do can */
    return farctx_model_kind(model, why, why_size) & NEEDS_ROPE ? method : FARCTX_METHOD_VANILLA;
}

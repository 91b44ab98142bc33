/* farctx: parameters: defaults, resolution against a model, validation (all from the tables
 * in farctx-methods.c and the methods' operations) */
#include "farctx-impl.h"

struct farctx_params farctx_default_params(void) {
    struct farctx_params p = { .method = FARCTX_METHOD_VANILLA };
    for (int32_t i = 0; i < farctx_param_count(); ++i) {
        farctx_param_set(&p, i, farctx_param_get_info(i).default_value);
    }
    return p;
}

void farctx_params_resolve(struct farctx_params * p, const struct llama_model * model) {
    if (p->n_ctx_train <= 0 && model != NULL) {
        p->n_ctx_train = llama_model_n_ctx_train(model);
    }
    if (p->n_local <= 0) {
        const struct farctx_method_def * d = farctx_method_def(p->method);
        const bool own = d != NULL && d->ops != NULL && d->ops->local_default != NULL;
        p->n_local = own ? d->ops->local_default(p) : p->n_ctx_train;
    }
    if (p->neighbor <= 0) {
        p->neighbor = p->n_ctx_train / 2;
    }
    const struct farctx_method_def * own = farctx_method_def(p->method);
    if (own != NULL && own->ops != NULL && own->ops->resolve != NULL) {
        own->ops->resolve(p);
    }
}

int32_t farctx_params_validate(const struct farctx_params * params, const struct llama_model * model,
                               char * err, size_t err_size) {
    if (params == NULL) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "no parameters");
    }
    const struct farctx_method_def * d = farctx_method_def(params->method);
    if (d == NULL) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "unknown method %d", params->method);
    }

    for (int32_t i = 0; i < farctx_param_count(); ++i) {
        const struct farctx_param_info info = farctx_param_get_info(i);
        const int32_t value = farctx_param_get(params, i);
        if (value < info.min_value) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "%s must be >= %d (got %d)",
                               info.name, info.min_value, value);
        }
    }

    if (d->ops == NULL) {
        return farctx_fail(err, err_size, FARCTX_ERR_UNSUPPORTED,
                           "method '%s' is not available in this build of farctx", d->info.name);
    }

    if (model != NULL) {
        struct farctx_params p = *params;
        farctx_params_resolve(&p, model);
        if (p.n_ctx_train <= 0) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                               "the model does not declare its trained context length: set n_ctx_train");
        }
        if (d->ops->validate != NULL) {
            const int32_t rc = d->ops->validate(&p, err, err_size);
            if (rc != FARCTX_OK) {
                return rc;
            }
        }
        if (p.n_local < 1) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                               "n_local must be >= 1 (n_ctx_train %d, n_sink %d)", p.n_ctx_train, p.n_sink);
        }
    }

    return farctx_fail(err, err_size, FARCTX_OK, "%s", "");
}

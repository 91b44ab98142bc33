/* farctx: vanilla attention (docs/methods.md): llama.cpp's own graph, every key at its true distance */
#include "farctx-impl.h"

#include <stdint.h>

static void setup(struct farctx_session * s, struct llama_attn_extrap_params * out) {
    (void) s;
    *out = llama_attn_extrap_default_params();  /* mode NONE: the stock graph */
}

static int64_t plain_below(const struct farctx_session * s) {
    (void) s;
    return INT64_MAX;
}

const struct farctx_method_ops farctx_vanilla_ops = {
    .setup       = setup,
    .plain_below = plain_below,
};

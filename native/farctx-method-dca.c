/*
 * farctx: Dual Chunk Attention (docs/methods.md#dca): every key stays, no query-key distance exceeds chunk_size.
 *
 * Chunks of s = chunk_size - local_window tokens from position 0. A query i reads key j <= i at relpos
 *   same chunk:       i - j
 *   previous chunk:   min(i mod s + s, chunk_size) - j mod s
 *   earlier chunks:   min(2s - 1, chunk_size) - j mod s
 * The stock cache holds every key at its true position; two key segments over the same cells carry the rule:
 *   main segment:     query and keys at their true positions (relpos i - j): the same chunk, and the previous
 *                     chunk while i mod s + s <= chunk_size (min() then takes its first term, which is i - j)
 *   second segment:   the query at chunk_size; a key of the previous chunk at j mod s (relpos chunk_size -
 *                     j mod s, where the clamp binds), a key of an earlier chunk at j mod s + chunk_size - c2
 *                     (relpos c2 - j mod s, c2 = min(2s - 1, chunk_size))
 * Which chunk a key is to the query decides its second-segment position, so a llama_decode never crosses a chunk
 * boundary (segment_end): the queries of a ubatch share their chunk.
 */
#include "farctx-impl.h"

#include <math.h>
#include <stdint.h>

static int32_t stride(const struct farctx_params * p) {
    return p->chunk_size - p->local_window;
}

/* the query position of the earlier chunks */
static int32_t inter_q(const struct farctx_params * p) {
    const int32_t s = stride(p);
    return 2 * s - 1 < p->chunk_size ? 2 * s - 1 : p->chunk_size;
}

/* the previous chunk at true distances: min(i mod s + s, chunk_size) takes its first term */
static bool succ_unclamped(const struct farctx_params * p, int32_t i) {
    return i % stride(p) + stride(p) <= p->chunk_size;
}

static bool main_allowed(const struct farctx_params * p, int32_t i, int32_t j) {
    if (j < 0 || j > i) {
        return false;
    }
    const int32_t ci = i / stride(p), cj = j / stride(p);
    return cj == ci || (cj == ci - 1 && succ_unclamped(p, i));
}

static bool seg2_allowed(const struct farctx_params * p, int32_t i, int32_t j) {
    if (j < 0 || j > i) {
        return false;
    }
    const int32_t ci = i / stride(p), cj = j / stride(p);
    return cj < ci - 1 || (cj == ci - 1 && !succ_unclamped(p, i));
}

/* key j's second-segment delta under queries of chunk ci (queried at chunk_size) */
static int32_t seg2_k_delta(const struct farctx_params * p, int32_t ci, int32_t j) {
    const int32_t s = stride(p), cj = j / s;
    if (j < 0 || cj >= ci) {
        return 0;  /* masked: the same chunk is the main segment's, later keys no query of the ubatch reads */
    }
    return j % s - j + (cj == ci - 1 ? 0 : p->chunk_size - inter_q(p));
}

static int32_t fill(void * user_data, struct llama_attn_extrap_ubatch * ub) {
    struct farctx_session * s = (struct farctx_session *) user_data;
    const struct farctx_params * p = &s->params;
    const int32_t ci = ub->q_pos[0] / stride(p);
    for (int32_t t = 0; t < ub->n_tokens; ++t) {
        const int32_t i = ub->q_pos[t];
        if (i / stride(p) != ci) {
            s->fill_error = true;
            farctx_session_fail(s, FARCTX_ERR_PARAM, "dca: the queries of a ubatch span chunks %d and %d "
                                "(positions %d and %d): feed the stream through farctx", ci, i / stride(p),
                                ub->q_pos[0], i);
            return 1;
        }
        float * row = ub->mask + (size_t) t * ub->n_kv;
        for (int32_t c = 0; c < ub->n_kv; ++c) {
            row[c] = main_allowed(p, i, ub->kv_pos[c]) ? 0.0f : -INFINITY;
        }
        float * row2 = ub->seg2_mask + (size_t) t * ub->n_seg2;
        for (int32_t c = 0; c < ub->n_seg2; ++c) {
            row2[c] = seg2_allowed(p, i, ub->seg2_pos[c]) ? 0.0f : -INFINITY;
        }
        ub->seg2_q_delta[t] = p->chunk_size - i;
    }
    for (int32_t c = 0; c < ub->n_seg2; ++c) {
        ub->seg2_k_delta[c] = seg2_k_delta(p, ci, ub->seg2_pos[c]);
    }
    return 0;
}

static void setup(struct farctx_session * s, struct llama_attn_extrap_params * out) {
    *out = llama_attn_extrap_default_params();
    out->mode      = LLAMA_ATTN_EXTRAP_CUSTOM;
    out->n_seg2    = -1;  /* every cell, at its chunk position */
    out->fill      = fill;
    out->user_data = (void *) s;
}

/* queries before the first clamped previous chunk and before the first earlier chunk read every key at its true
 * distance */
static int64_t plain_below(const struct farctx_session * s) {
    const int64_t clamped = (int64_t) s->params.chunk_size + 1, inter = 2 * (int64_t) stride(&s->params);
    return clamped < inter ? clamped : inter;
}

static int64_t segment_end(const struct farctx_session * s, int64_t pos) {
    const int64_t c = stride(&s->params);
    return (pos / c + 1) * c;
}

static int32_t validate(const struct farctx_params * p, char * err, size_t err_size) {
    if (p->local_window >= p->chunk_size || p->chunk_size > p->n_ctx_train) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                           "dca needs local_window < chunk_size <= n_ctx_train (local_window %d, chunk_size %d, "
                           "n_ctx_train %d)", p->local_window, p->chunk_size, p->n_ctx_train);
    }
    return FARCTX_OK;
}

const struct farctx_method_ops farctx_dca_ops = {
    .validate    = validate,
    .setup       = setup,
    .plain_below = plain_below,
    .segment_end = segment_end,
};

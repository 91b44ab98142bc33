/*
 * farctx: Dual Chunk Attention (docs/methods.md#dca): every key stays, no query-key distance exceeds chunk_size.
 *
 * Chunks of s = chunk_size - local_window tokens from position 0. A query i reads key j <= i at relpos
 *   same chunk:       i - j
 *   previous chunk:   min(i mod s + s, chunk_size) - j mod s   (i - j while i mod s <= local_window)
 *   earlier chunks:   c2 - j mod s, c2 = min(2s - 1, chunk_size)
 * The graph reads two key segments over the same cells and rotates no key, only the query:
 *   main segment:     the query at i: its own chunk, and the previous one while its distance is i - j
 *   second segment:   the query at chunk_size: the earlier chunks, and the previous one once it is clamped
 * The cache keeps every key where the segment that reads it needs it (rotated in place, its position kept):
 *   own chunk, and the previous one while unclamped:   j (as written)
 *   previous chunk, clamped:                          j mod s
 *   earlier chunks:                                   j mod s + chunk_size - c2 (j mod s with the defaults)
 * That layout follows the phase of the query (its chunk, and whether the previous chunk is clamped). The cache is
 * rotated when the phase changes (before_decode): twice per chunk while the stream grows, so every key is rotated at
 * most twice. A feed of fewer than COPY_MIN tokens (decoding) never crosses a phase boundary in a batch
 * (segment_end). A longer one (a prompt; chunk_size <= 2s - 1, as the defaults) runs in whole ubatches: a batch
 * that crosses phases holds the layout of its first query's phase, and its second segment reads a copy of the keys
 * rotated per cell to where the queries' phases read them (use_seg2_k_delta, batch_params). The copy costs one RoPE
 * of the cached keys per layer, which the batch's queries share.
 *
 * auto (docs/methods.md#auto) is this rule past the trained context and stock attention inside it: every query
 * before n_ctx_train reads every key at its true distance (phase 0: the cache as written, the stock graph), and the
 * cache moves to dca's layout at the first query from n_ctx_train on, as at any phase. With auto's default chunk
 * (chunk_size = n_ctx_train) every query up to n_ctx_train reads true distances (plain_below) and the first chunk's
 * keys are read where they were written (j mod s = j), so nothing moves at the boundary: auto is dca with that chunk.
 */
#include "farctx-impl.h"

#include <math.h>
#include <stdint.h>

static int64_t stride(const struct farctx_params * p) {
    return p->chunk_size - p->local_window;
}

/* the query position of the earlier chunks */
static int64_t inter_q(const struct farctx_params * p) {
    const int64_t s = stride(p);
    return 2 * s - 1 < p->chunk_size ? 2 * s - 1 : p->chunk_size;
}

/* the queries below this position read every key at its true distance: auto's n_ctx_train, dca's 0 */
static int64_t stock_below(const struct farctx_params * p) {
    return p->method == FARCTX_METHOD_AUTO ? p->n_ctx_train : 0;
}

/* 2 x chunk, + 1 once the previous chunk's query is clamped (i mod s + s > chunk_size; the first chunk has none);
 * phase 0 (every key as written) below stock_below */
static int64_t phase_of(const struct farctx_params * p, int64_t i) {
    if (i < stock_below(p)) {
        return 0;
    }
    const int64_t ci = i / stride(p);
    return 2 * ci + (ci > 0 && i % stride(p) > p->local_window);
}

/* where the layout of a phase keeps key j, relative to its true position */
static int64_t key_offset(const struct farctx_params * p, int64_t phase, int64_t j) {
    const int64_t s = stride(p), ci = phase / 2, cj = j / s;
    if (cj >= ci || (cj == ci - 1 && phase % 2 == 0)) {
        return 0;
    }
    return -cj * s + (cj == ci - 1 ? 0 : p->chunk_size - inter_q(p));
}

/* the first position the main segment reads in a phase: earlier positions are the second segment's */
static int64_t main_first(const struct farctx_params * p, int64_t phase) {
    const int64_t first = (phase / 2 - (phase % 2 == 0)) * stride(p);
    return first > 0 ? first : 0;
}

/* a feed of at least this many tokens crosses phases in one batch, its second segment read as a rotated copy (one Q
 * tile of ggml's CPU flash attention: below it a RoPE of every cached key per layer costs more than the cut saves) */
enum { COPY_MIN = 64 };

static int32_t fill(void * user_data, struct llama_attn_extrap_ubatch * ub) {
    struct farctx_session * s = (struct farctx_session *) user_data;
    const struct farctx_params * p = &s->params;
    const struct farctx_key_layout * d = farctx_key_layout_of(s);
    /* batch_params: a prompt batch that crosses phases, its second segment a copy of the keys at j mod s: where the
     * earlier chunks' query is chunk_size (chunk_size <= 2s - 1), the only case with a phase inside a chunk */
    const bool copy = ub->seg2_k_delta != NULL;
    if (phase_of(p, ub->q_pos[0]) != d->layout || ub->n_seg2 != ub->n_kv ||
            (copy && p->chunk_size != inter_q(p))) {
        s->fill_error = true;
        farctx_session_fail(s, FARCTX_ERR_PARAM, "%s: the cache or the attention settings do not match the query "
                            "at %d: feed the stream through farctx", farctx_method_name(p->method), ub->q_pos[0]);
        return 1;
    }
    int64_t p0 = 0;
    const int32_t m = farctx_cells_in_order(ub->kv_pos, ub->n_kv, &p0);
    for (int32_t t = 0; t < ub->n_tokens; ++t) {
        const int64_t i = ub->q_pos[t], phase = phase_of(p, i);
        if (!copy && phase != d->layout) {
            s->fill_error = true;
            farctx_session_fail(s, FARCTX_ERR_PARAM, "%s: the queries of a ubatch span two phases (positions %d "
                                "and %lld): feed the stream through farctx", farctx_method_name(p->method),
                                ub->q_pos[0], (long long) i);
            return 1;
        }
        const int64_t lo = main_first(p, phase);
        float * row  = ub->mask      + (size_t) t * ub->n_kv;
        float * row2 = ub->seg2_mask + (size_t) t * ub->n_seg2;
        if (m >= 0) {  /* as runs of cells: positions [lo, i] and [0, lo), of those cached and up to i */
            const int64_t upto = i + 1 < p0 + m ? i + 1 : p0 + m;
            farctx_mask_run(row,  ub->n_kv, lo - p0, upto - p0);
            farctx_mask_run(row2, ub->n_kv, -p0, (lo < upto ? lo : upto) - p0);
        } else {
            for (int32_t c = 0; c < ub->n_kv; ++c) {
                const int64_t j = ub->kv_pos[c];
                row[c]  = (j >= lo && j <= i)           ? 0.0f : -INFINITY;
                row2[c] = (j >= 0  && j < lo && j <= i) ? 0.0f : -INFINITY;
            }
        }
        ub->seg2_q_delta[t] = (int32_t) (p->chunk_size - i);
    }
    if (copy) {  /* each cached key from where the layout holds it to where the second segment reads it */
        for (int32_t c = 0; c < ub->n_seg2; ++c) {
            const int64_t j = ub->seg2_pos[c];
            ub->seg2_k_delta[c] = j < 0 ? 0 : (int32_t) (j % stride(p) - (j + key_offset(p, d->layout, j)));
        }
    }
    return 0;
}

/* before a llama_decode at pos: the cached keys [0, pos) to the layout of pos's phase (the K-shift at the start of
 * the llama_decode applies it). The batch's own keys are in its chunk: written where every layout keeps them */
static int32_t rotate_cache(struct farctx_session * s, int64_t pos, int32_t n_tokens) {
    (void) n_tokens;
    return farctx_key_layout_move(s, 0, pos, key_offset, phase_of(&s->params, pos));
}

static void setup(struct farctx_session * s, struct llama_attn_extrap_params * out) {
    *out = llama_attn_extrap_default_params();
    out->mode             = LLAMA_ATTN_EXTRAP_CUSTOM;
    out->n_seg2           = -1;     /* every cell */
    out->use_seg2_k_delta = false;  /* the keys sit where their segment reads them (rotate_cache) */
    out->fill             = fill;
    out->user_data        = (void *) s;
}

/* queries before the first clamped previous chunk and before the first earlier chunk read every key at its true
 * distance, the cache in its written layout; so do auto's below n_ctx_train */
static int64_t plain_below(const struct farctx_session * s) {
    const int64_t clamped = (int64_t) s->params.chunk_size + 1, inter = 2 * stride(&s->params);
    const int64_t dca = clamped < inter ? clamped : inter, stock = stock_below(&s->params);
    return stock > dca ? stock : dca;
}

/* with COPY_MIN or more tokens to feed, no end where the copy serves every query (chunk_size <= 2s - 1: the
 * defaults); otherwise the end of the phase (with chunk_size > 2s - 1 the phases are the chunks) */
static int64_t segment_end(const struct farctx_session * s, int64_t pos, int32_t n_left) {
    const struct farctx_params * p = &s->params;
    const int64_t c = stride(p), start = (pos / c) * c, clamp = start + p->local_window + 1;
    if (n_left >= COPY_MIN && p->chunk_size == inter_q(p)) {
        return INT64_MAX;
    }
    if (pos < stock_below(p)) {
        return stock_below(p);  /* phase 0 ends there */
    }
    return start > 0 && pos < clamp && clamp < start + c ? clamp : start + c;
}

/* the copy for a batch that crosses a phase (segment_end lets only a long feed's do); a batch within one phase
 * reads the cache as it is */
static void batch_params(const struct farctx_session * s, int64_t pos, int32_t n_tokens,
                         struct llama_attn_extrap_params * ex) {
    const struct farctx_params * p = &s->params;
    ex->use_seg2_k_delta = phase_of(p, pos) != phase_of(p, pos + n_tokens - 1);
}

static int32_t validate(const struct farctx_params * p, char * err, size_t err_size) {
    if (p->local_window >= p->chunk_size || p->chunk_size > p->n_ctx_train) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                           "%s needs local_window < chunk_size <= n_ctx_train (local_window %d, chunk_size %d, "
                           "n_ctx_train %d)", farctx_method_name(p->method), p->local_window, p->chunk_size, p->n_ctx_train);
    }
    return FARCTX_OK;
}

/* dca's defaults are ChunkLlama's (replace_with_chunkllama): chunk_size 3/4 of the trained context, local_window
 * 1/8; auto's chunk_size is the trained context itself, so that its first query past it still reads every key at its
 * true distance (docs/methods.md, "Why auto is what it is") */
static void resolve(struct farctx_params * p) {
    if (p->chunk_size <= 0) {
        p->chunk_size = p->method == FARCTX_METHOD_AUTO ? p->n_ctx_train : p->n_ctx_train * 3 / 4;
    }
    if (p->local_window <= 0) {
        p->local_window = p->n_ctx_train / 8;
    }
}

#define DCA_OPS \
    .resolve       = resolve, \
    .validate      = validate, \
    .setup         = setup, \
    .plain_below   = plain_below, \
    .segment_end   = segment_end, \
    .batch_params  = batch_params, \
    .before_decode = rotate_cache, \
    FARCTX_KEY_LAYOUT_OPS

const struct farctx_method_ops farctx_dca_ops  = { DCA_OPS };
const struct farctx_method_ops farctx_auto_ops = { DCA_OPS };  /* the same operations: stock_below tells them apart */

/* farctx: the attention methods' definitions (DESIGN.md section 1) as per-ubatch masks and RoPE deltas */
#include "farctx-impl.h"

#include <math.h>
#include <stdint.h>

/* The main segment's rule: key j (true position) is visible from query i, with relpos i - j, iff
 * 0 <= j <= i and (i - j < window or j < always). One window per method, and lambda-only also keeps its
 * globals at any distance; the per-ubatch fill tests it as a range per row */
static int32_t main_window(const struct farctx_params * p) {
    switch (p->method) {
        case FARCTX_METHOD_WINDOW:
        case FARCTX_METHOD_LMINF:
        case FARCTX_METHOD_STREAMING:
        case FARCTX_METHOD_LAMBDA_ONLY:
        case FARCTX_METHOD_REROPE:      return p->n_local;
        case FARCTX_METHOD_SELFEXTEND:  return p->neighbor;
        default:                        return INT32_MAX;
    }
}

static int32_t main_always(const struct farctx_params * p) {
    return p->method == FARCTX_METHOD_LAMBDA_ONLY ? p->n_global : 0;
}

static bool main_visible(int32_t i, int32_t j, int64_t lo, int32_t always) {
    return j >= 0 && j <= i && (j >= lo || j < always);
}

static bool main_allowed(const struct farctx_params * p, int32_t i, int32_t j) {
    return main_visible(i, j, (int64_t) i - main_window(p) + 1, main_always(p));
}

static void fill_main_row(const struct farctx_params * p, int32_t i, const int32_t * kv_pos, int32_t n, float * row) {
    const int64_t lo     = (int64_t) i - main_window(p) + 1;  /* first key inside the window */
    const int32_t always = main_always(p);
    for (int32_t c = 0; c < n; ++c) {
        row[c] = main_visible(i, kv_pos[c], lo, always) ? 0.0f : -INFINITY;
    }
}

/* second segment (bounded distance): keys beyond the window, seen at distance n_local */
static bool seg2_allowed(const struct farctx_params * p, int32_t i, int32_t j) {
    const int32_t window = p->method == FARCTX_METHOD_SELFEXTEND ? p->neighbor : p->n_local;
    if (j < 0 || j > i || i - j < window) {
        return false;
    }
    switch (p->method) {
        case FARCTX_METHOD_LMINF:     return j < p->n_global;
        case FARCTX_METHOD_STREAMING: return j < p->n_sink;
        case FARCTX_METHOD_REROPE:
        case FARCTX_METHOD_SELFEXTEND: return true;
        default:                       return false;
    }
}

int32_t farctx_policy_setup(const struct farctx_session * s, struct llama_attn_extrap_params * out) {
    const struct farctx_params * p = &s->params;
    *out = llama_attn_extrap_default_params();
    if (p->method == FARCTX_METHOD_VANILLA) {
        return FARCTX_OK;
    }
    out->mode      = LLAMA_ATTN_EXTRAP_CUSTOM;
    out->fill      = farctx_policy_fill;
    out->user_data = (void *) s;
    switch (p->method) {
        case FARCTX_METHOD_LMINF:     out->n_seg2 = p->n_global; break;  /* the globals: cells [0, G) */
        case FARCTX_METHOD_STREAMING: out->n_seg2 = p->n_sink;   break;  /* the sinks: cells [0, S)   */
        case FARCTX_METHOD_REROPE:
        case FARCTX_METHOD_SELFEXTEND: out->n_seg2 = -1;         break;  /* every cell                */
        default:                       out->n_seg2 = 0;          break;
    }
    if (p->method == FARCTX_METHOD_MESA) {
        /* the last chunk and decoding: keys at stair positions, log-n query scale (middle chunks:
         * farctx_mesa_batch_params) */
        out->use_k_delta = true;
        out->use_q_scale = true;
    }
    return FARCTX_OK;
}

/*
 * Second segment, as RoPE positions: query at q2(i), key j at k2(j), so relpos = q2(i) - k2(j).
 *   lminf, rerope: q2 = n_local, k2 = 0                      -> relpos n_local
 *   streaming:     q2 = min(n_sink + R - 1, i), k2 = j (true) -> the cache-index distance of
 *                  StreamingLLM: query at its cache slot, sink s at slot s
 */
static int32_t seg2_query_pos(const struct farctx_params * p, int32_t i) {
    if (p->method == FARCTX_METHOD_SELFEXTEND) {
        /* grouped: floor(i/G) - floor(j/G) + W - floor(W/G) */
        return i / p->group + p->neighbor - p->neighbor / p->group;
    }
    if (p->method == FARCTX_METHOD_STREAMING) {
        const int32_t last_slot = p->n_sink + p->n_local - 1;
        return i < last_slot ? i : last_slot;
    }
    return p->n_local;
}

static int32_t seg2_key_pos(const struct farctx_params * p, int32_t j) {
    switch (p->method) {
        case FARCTX_METHOD_STREAMING:  return j;
        case FARCTX_METHOD_SELFEXTEND: return j / p->group;
        default:                       return 0;
    }
}

/* tokens at the head of the stream that never leave the cache */
static int32_t head_tokens(const struct farctx_params * p) {
    switch (p->method) {
        case FARCTX_METHOD_LMINF:
        case FARCTX_METHOD_LAMBDA_ONLY: return p->n_global;
        case FARCTX_METHOD_STREAMING:   return p->n_sink;
        default:                        return 0;
    }
}

int32_t farctx_policy_head(const struct farctx_params * p) {
    return head_tokens(p);
}

int64_t farctx_policy_plain_below(const struct farctx_session * s) {
    const struct farctx_params * p = &s->params;
    switch (p->method) {
        case FARCTX_METHOD_VANILLA:     return INT64_MAX;
        case FARCTX_METHOD_LMINF:
        case FARCTX_METHOD_WINDOW:
        case FARCTX_METHOD_LAMBDA_ONLY:
        case FARCTX_METHOD_REROPE:
        case FARCTX_METHOD_STREAMING:   return p->n_local;   /* every key within the window */
        case FARCTX_METHOD_SELFEXTEND:  return p->neighbor;  /* every key within the neighbours */
        case FARCTX_METHOD_MESA:
            /* a chunked prompt: its first chunk; otherwise until the cache passes the trained context
             * (then stair positions and the log-n scale start) */
            return s->mesa.chunked ? p->first_chunk : p->n_ctx_train;
        default:                        return 0;
    }
}

void farctx_policy_batch_params(const struct farctx_session * s, int32_t n_tokens, struct llama_attn_extrap_params * ex) {
    const int32_t head = head_tokens(&s->params);
    if (n_tokens == 1 && head > 0 && ex->n_seg2 == head) {
        /* one query: the head segment's bounded distance can rotate its keys instead of the query, so both
         * segments share the query, and the main one starts after the head cells (one flash-attention call
         * over both ranges where the cache allows it) */
        ex->kv_first = head;
    }
}

/* one query, the head cells as segment 2 beside the main segment's other cells, both under the main
 * query: a head key inside the window at its true distance, beyond it moved to where the query's bounded
 * distance puts it (relpos = seg2_query_pos(i) - seg2_key_pos(j)) */
static int32_t fill_single_query(struct farctx_session * s, struct llama_attn_extrap_ubatch * ub) {
    const struct farctx_params * p = &s->params;
    if (ub->n_tokens != 1) {
        s->fill_error = true;
        farctx_session_fail(s, FARCTX_ERR_PARAM, "%s: %d queries in a single-query ubatch",
                            farctx_method_name(p->method), ub->n_tokens);
        return 1;
    }
    const int32_t i = ub->q_pos[0];
    fill_main_row(p, i, ub->kv_pos, ub->n_kv, ub->mask);
    for (int32_t c = 0; c < ub->n_seg2; ++c) {
        const int32_t j = ub->seg2_pos[c];
        const bool near = main_allowed(p, i, j), far = seg2_allowed(p, i, j);
        ub->seg2_mask[c] = near || far ? 0.0f : -INFINITY;
        ub->seg2_k_delta[c] = far ? (seg2_key_pos(p, j) - j) - (seg2_query_pos(p, i) - i) : 0;
    }
    ub->seg2_q_delta[0] = 0;
    return 0;
}

int32_t farctx_policy_fill(void * user_data, struct llama_attn_extrap_ubatch * ub) {
    struct farctx_session * s = (struct farctx_session *) user_data;
    const struct farctx_params * p = &s->params;
    if (p->method == FARCTX_METHOD_MESA) {
        return farctx_mesa_fill(s, ub);
    }
    for (int32_t c = 0; c < ub->n_seg2 && head_tokens(p) > 0; ++c) {
        const int32_t j = ub->seg2_pos[c];
        if (j >= 0 && j != c) {
            s->fill_error = true;
            farctx_session_fail(s, FARCTX_ERR_PARAM, "the global/sink tokens are not in the first cells of the "
                                "cache (cell %d holds position %d): start the stream in an empty cache", c, j);
            return 1;
        }
    }
    if (s->active.kv_first > 0) {
        return fill_single_query(s, ub);
    }

    for (int32_t t = 0; t < ub->n_tokens; ++t) {
        const int32_t i = ub->q_pos[t];
        fill_main_row(p, i, ub->kv_pos, ub->n_kv, ub->mask + (size_t) t * ub->n_kv);
        if (ub->n_seg2 > 0) {
            float * row2 = ub->seg2_mask + (size_t) t * ub->n_seg2;
            for (int32_t c = 0; c < ub->n_seg2; ++c) {
                row2[c] = seg2_allowed(p, i, ub->seg2_pos[c]) ? 0.0f : -INFINITY;
            }
            ub->seg2_q_delta[t] = seg2_query_pos(p, i) - i;
        }
    }
    for (int32_t c = 0; c < ub->n_seg2; ++c) {
        const int32_t j = ub->seg2_pos[c];
        ub->seg2_k_delta[c] = j >= 0 ? seg2_key_pos(p, j) - j : 0;
    }
    return 0;
}

int64_t farctx_policy_first_needed(const struct farctx_session * s, int64_t next_pos) {
    const struct farctx_params * p = &s->params;
    switch (p->method) {
        case FARCTX_METHOD_LMINF:
        case FARCTX_METHOD_WINDOW:
        case FARCTX_METHOD_LAMBDA_ONLY:
        case FARCTX_METHOD_STREAMING:
            /* the next query at next_pos reads keys j > next_pos - n_local (and the head tokens) */
            return next_pos - p->n_local + 1;
        default:
            return 0;  /* keeps every key */
    }
}

bool farctx_method_fixed_cache(int32_t method) {
    return method == FARCTX_METHOD_LMINF || method == FARCTX_METHOD_WINDOW ||
           method == FARCTX_METHOD_LAMBDA_ONLY || method == FARCTX_METHOD_STREAMING;
}

bool farctx_policy_fixed_cache(const struct farctx_params * p) {
    return farctx_method_fixed_cache(p->method);
}

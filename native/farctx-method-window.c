/*
 * farctx: the window family (docs/methods.md): lminf, window, lambda-only, rerope, streaming, selfextend, string.
 *
 * Each is one main window over true distances plus, for some, a second key segment at a bounded distance:
 *   main segment:   key j visible from query i, relpos i - j, iff 0 <= j <= i and (i - j < window or
 *                   j < always); window = n_local (selfextend: neighbor); always = lambda-only's globals
 *   second segment: keys beyond the window (the head tokens only, or every key), query at q2(i), key j
 *                   at k2(j): relpos q2(i) - k2(j)
 *   every logit:    times logit_scale (string's attention factor; 1 for the others), as a factor on the query
 * A method is its rule below; the fixed-cache ones (lminf, window, lambda-only, streaming) also evict.
 *
 * rerope and selfextend read every key beyond the window at k2(j), a position of the key alone, and every key
 * within it at j. Each key moves once, in place, to k2(j) as it leaves the window: the graph of each batch first
 * rotates the keys that left it since the batch before (n_k_move: one per generated token, a ubatch's worth per
 * prompt ubatch), so a generated token rotates one key and its query, and its graph is reused from token to token.
 * A larger move (back on a rewind, to a loaded state's layout) goes through the K-shift before the llama_decode. A
 * batch whose later queries read keys beyond the window that its first query still reads within it (a prompt)
 * rotates a copy of those for its second segment.
 */
#include "farctx-impl.h"

#include <math.h>
#include <stdint.h>

enum seg2_keys {
    SEG2_NONE,   /* no second segment                                     */
    SEG2_HEAD,   /* the head tokens (the table's head parameter): [0, head) */
    SEG2_ALL,    /* every cell                                            */
};

struct window_rule {
    int32_t window;        /* FARCTX_PARAM_* of the main window: n_local or neighbor */
    bool    head_always;   /* the head tokens are seen at any distance, in the main segment */
    int     seg2;          /* enum seg2_keys */
    /* second segment, as RoPE positions */
    int32_t (*q2)(const struct farctx_params * p, int32_t i);
    int32_t (*k2)(const struct farctx_params * p, int32_t j);
    float   logit_scale;   /* 0: none (1) */
    /* where the cache keeps key j while the keys [0, layout) are moved to k2 (NULL: the keys stay where written,
     * the second segment reads a rotated copy) */
    farctx_key_offset_fn moved;
};

static const struct window_rule * rule_of(const struct farctx_session * s) {
    return (const struct window_rule *) s->ops->rule;
}

static int32_t main_window(const struct farctx_session * s) {
    return farctx_param_get(&s->params, rule_of(s)->window);
}

static int32_t main_always(const struct farctx_session * s) {
    return rule_of(s)->head_always ? farctx_params_head(&s->params) : 0;
}

/* The main segment's rule (one predicate for the single test and the per-row fill) */
static bool main_visible(int32_t i, int32_t j, int64_t lo, int32_t always) {
    return j >= 0 && j <= i && (j >= lo || j < always);
}

static bool main_allowed(const struct farctx_session * s, int32_t i, int32_t j) {
    return main_visible(i, j, (int64_t) i - main_window(s) + 1, main_always(s));
}

static void fill_main_row(const struct farctx_session * s, int32_t i, const int32_t * kv_pos, int32_t n, float * row) {
    const int64_t lo     = (int64_t) i - main_window(s) + 1;  /* first key inside the window */
    const int32_t always = main_always(s);
    for (int32_t c = 0; c < n; ++c) {
        row[c] = main_visible(i, kv_pos[c], lo, always) ? 0.0f : -INFINITY;
    }
}

/* second segment (bounded distance): keys beyond the window, j < below = i - window + 1, and of those the head
 * tokens only (j < upto) or every one. One predicate for the single test and the per-row fill */
static bool seg2_visible(int32_t j, int64_t below, int64_t upto) {
    return j >= 0 && j < below && j < upto;
}

static int64_t seg2_upto(const struct farctx_session * s) {
    switch (rule_of(s)->seg2) {
        case SEG2_HEAD: return farctx_params_head(&s->params);
        case SEG2_ALL:  return INT64_MAX;
        default:        return 0;
    }
}

static bool seg2_allowed(const struct farctx_session * s, int32_t i, int32_t j) {
    return seg2_visible(j, (int64_t) i - main_window(s) + 1, seg2_upto(s));
}

static void fill_seg2_row(const struct farctx_session * s, int32_t i, const int32_t * pos, int32_t n, float * row) {
    const int64_t below = (int64_t) i - main_window(s) + 1, upto = seg2_upto(s);
    for (int32_t c = 0; c < n; ++c) {
        row[c] = seg2_visible(pos[c], below, upto) ? 0.0f : -INFINITY;
    }
}

/* lminf, rerope: query at n_local, every key at 0 -> relpos n_local */
static int32_t q2_bounded(const struct farctx_params * p, int32_t i) { (void) i; return p->n_local; }
static int32_t k2_zero(const struct farctx_params * p, int32_t j) { (void) p; (void) j; return 0; }

/* streaming: the cache-index distance of StreamingLLM: query at its cache slot, sink s at slot s */
static int32_t q2_cache_slot(const struct farctx_params * p, int32_t i) {
    const int32_t last_slot = p->n_sink + p->n_local - 1;
    return i < last_slot ? i : last_slot;
}
static int32_t k2_true(const struct farctx_params * p, int32_t j) { (void) p; return j; }

/* selfextend, grouped: floor(i/G) - floor(j/G) + W - floor(W/G) */
static int32_t q2_grouped(const struct farctx_params * p, int32_t i) {
    return i / p->group + p->neighbor - p->neighbor / p->group;
}
static int32_t k2_grouped(const struct farctx_params * p, int32_t j) { return j / p->group; }

/* the layouts of the rules whose keys move: keys below `layout` at k2(j) */
static int64_t rerope_moved(const struct farctx_params * p, int64_t layout, int64_t j) {
    return j < layout ? k2_zero(p, (int32_t) j) - j : 0;
}
static int64_t selfextend_moved(const struct farctx_params * p, int64_t layout, int64_t j) {
    return j < layout ? k2_grouped(p, (int32_t) j) - j : 0;
}

/* string: the keys from shifted_offset S on read S - W nearer: query at i - S + W, keys where they are */
static int32_t q2_shifted(const struct farctx_params * p, int32_t i) {
    return i - p->shifted_offset + p->local_value;
}

static int32_t fill(void * user_data, struct llama_attn_extrap_ubatch * ub);

static bool scaled(const struct window_rule * r) {
    return r->logit_scale != 0.0f && r->logit_scale != 1.0f;
}

/* q_scale of every query: the rule's logit scale */
static void fill_scale(const struct window_rule * r, struct llama_attn_extrap_ubatch * ub) {
    for (int32_t t = 0; ub->q_scale != NULL && t < ub->n_tokens; ++t) {
        ub->q_scale[t] = scaled(r) ? r->logit_scale : 1.0f;
    }
}

static void setup(struct farctx_session * s, struct llama_attn_extrap_params * out) {
    *out = llama_attn_extrap_default_params();
    out->mode        = LLAMA_ATTN_EXTRAP_CUSTOM;
    out->fill        = fill;
    out->user_data   = (void *) s;
    out->use_q_scale = scaled(rule_of(s));
    switch (rule_of(s)->seg2) {
        case SEG2_HEAD: out->n_seg2 = farctx_params_head(&s->params); break;  /* the globals / sinks: cells [0, head) */
        case SEG2_ALL:  out->n_seg2 = -1;                             break;  /* every cell */
        default:        out->n_seg2 = 0;                              break;
    }
}

static int64_t plain_below(const struct farctx_session * s) {
    /* every key within the window; a scaled rule changes every logit: never */
    return scaled(rule_of(s)) ? 0 : main_window(s);
}

/* the fixed-cache methods: the next query at next_pos reads keys j > next_pos - n_local (and the head tokens) */
static int64_t first_needed(const struct farctx_params * p, int64_t next_pos) {
    return next_pos - p->n_local + 1;
}

/* keys [0, far_below(i)) are beyond the window of the query at i */
static int64_t far_below(const struct farctx_session * s, int64_t i) {
    const int64_t first = i - main_window(s) + 1;
    return first > 0 ? first : 0;
}

/* the keys that left the window since the cache's layout, when the graph of the batch at pos rotates them itself
 * (n_k_move): at most a ubatch of them, the stream going forward (a generated token moves one key, a prompt's ubatch
 * the count of the one before it); 0 when none left or the cache moves back (a rewind, a loaded state) */
static int32_t graph_moves(const struct farctx_session * s, int64_t pos) {
    const int64_t n = far_below(s, pos) - farctx_key_layout_of(s)->layout;
    return n > 0 && n <= (int64_t) llama_n_ubatch(s->ctx) ? (int32_t) n : 0;
}

static void batch_params(const struct farctx_session * s, int64_t pos, int32_t n_tokens,
                         struct llama_attn_extrap_params * ex) {
    if (rule_of(s)->moved != NULL) {
        ex->n_k_move = graph_moves(s, pos);
        /* the keys that the last query reads beyond the window and the first within it: not moved yet */
        ex->use_seg2_k_delta = far_below(s, pos + n_tokens - 1) > far_below(s, pos);
        return;
    }
    const int32_t head = farctx_params_head(&s->params);
    if (n_tokens == 1 && head > 0 && ex->n_seg2 == head) {
        /* one query: the head segment's bounded distance can rotate its keys instead of the query, so both
         * segments share the query, and the main one starts after the head cells (one flash-attention call
         * over both ranges where the cache allows it) */
        ex->kv_first = head;
    } else if (rule_of(s)->k2 == k2_true) {
        ex->use_seg2_k_delta = false;  /* the second segment reads the keys where they are written */
    }
}

/* one query, the head cells as segment 2 beside the main segment's other cells, both under the main
 * query: a head key inside the window at its true distance, beyond it moved to where the query's bounded
 * distance puts it (relpos = q2(i) - k2(j)) */
static int32_t fill_single_query(struct farctx_session * s, struct llama_attn_extrap_ubatch * ub) {
    const struct farctx_params * p = &s->params;
    const struct window_rule * r = rule_of(s);
    if (ub->n_tokens != 1) {
        s->fill_error = true;
        farctx_session_fail(s, FARCTX_ERR_PARAM, "%s: %d queries in a single-query ubatch",
                            farctx_method_name(p->method), ub->n_tokens);
        return 1;
    }
    const int32_t i = ub->q_pos[0];
    fill_main_row(s, i, ub->kv_pos, ub->n_kv, ub->mask);
    for (int32_t c = 0; c < ub->n_seg2; ++c) {
        const int32_t j = ub->seg2_pos[c];
        const bool near = main_allowed(s, i, j), far = seg2_allowed(s, i, j);
        ub->seg2_mask[c] = near || far ? 0.0f : -INFINITY;
        ub->seg2_k_delta[c] = far ? (r->k2(p, j) - j) - (r->q2(p, i) - i) : 0;
    }
    ub->seg2_q_delta[0] = 0;
    fill_scale(r, ub);
    return 0;
}

static int32_t fill(void * user_data, struct llama_attn_extrap_ubatch * ub) {
    struct farctx_session * s = (struct farctx_session *) user_data;
    const struct farctx_params * p = &s->params;
    const struct window_rule * r = rule_of(s);
    const int32_t head = farctx_params_head(p);
    for (int32_t c = 0; c < ub->n_seg2 && head > 0; ++c) {
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
    /* keys [0, moved_below) at k2 once the graph has rotated [layout, moved_below) (n_k_move) */
    const int64_t layout = r->moved != NULL ? farctx_key_layout_of(s)->layout : 0;
    const int64_t moved_below = r->moved != NULL && ub->n_tokens > 0 ? far_below(s, ub->q_pos[0]) : layout;
    if (moved_below - layout != ub->n_k_move) {
        s->fill_error = true;
        farctx_session_fail(s, FARCTX_ERR_PARAM, "%s: the cache does not match the query at %d: feed the stream "
                            "through farctx", farctx_method_name(p->method), ub->n_tokens > 0 ? ub->q_pos[0] : -1);
        return 1;
    }
    for (int32_t c = 0, m = 0; m < ub->n_k_move; ++c) {
        if (c == ub->n_kv) {
            s->fill_error = true;
            farctx_session_fail(s, FARCTX_ERR_PARAM, "%s: the keys from position %lld are not in the cache",
                                farctx_method_name(p->method), (long long) layout);
            return 1;
        }
        const int32_t j = ub->kv_pos[c];
        if (j >= layout && j < moved_below) {
            ub->k_move_cell[m]    = c;
            ub->k_move_delta[m++] = (int32_t) (r->moved(p, moved_below, j) - r->moved(p, layout, j));
        }
    }

    /* a stream fed in order (the cells hold positions p0, p0 + 1, ...): each row is a run of cells */
    int64_t p0 = 0, q0 = 0;
    const int32_t m  = main_always(s) == 0 ? farctx_cells_in_order(ub->kv_pos, ub->n_kv, &p0) : -1;
    const int32_t m2 = ub->n_seg2 > 0 ? farctx_cells_in_order(ub->seg2_pos, ub->n_seg2, &q0) : -1;
    const int64_t upto = seg2_upto(s);
    for (int32_t t = 0; t < ub->n_tokens; ++t) {
        const int32_t i = ub->q_pos[t];
        const int64_t below = (int64_t) i - main_window(s) + 1;  /* the window's first key */
        float * row = ub->mask + (size_t) t * ub->n_kv;
        if (m >= 0) {  /* keys [below, i] of those cached */
            farctx_mask_run(row, ub->n_kv, below - p0, (i + 1 < p0 + m ? i + 1 : p0 + m) - p0);
        } else {
            fill_main_row(s, i, ub->kv_pos, ub->n_kv, row);
        }
        if (ub->n_seg2 > 0) {
            float * row2 = ub->seg2_mask + (size_t) t * ub->n_seg2;
            if (m2 >= 0) {  /* keys [0, min(below, upto)) of those cached */
                const int64_t end = below < upto ? below : upto;
                farctx_mask_run(row2, ub->n_seg2, -q0, (end < q0 + m2 ? end : q0 + m2) - q0);
            } else {
                fill_seg2_row(s, i, ub->seg2_pos, ub->n_seg2, row2);
            }
            ub->seg2_q_delta[t] = r->q2(p, i) - i;
        }
    }
    for (int32_t c = 0; c < ub->n_seg2 && ub->seg2_k_delta != NULL; ++c) {
        const int32_t j = ub->seg2_pos[c];
        ub->seg2_k_delta[c] = j >= moved_below ? r->k2(p, j) - j : 0;  /* from where the cache keeps it */
    }
    fill_scale(r, ub);
    return 0;
}

/* before a llama_decode at pos: the keys beyond the window of the query at pos to k2, the others (after a rewind)
 * back where they were written. The batch's graph rotates the keys that left the window since the last batch
 * (graph_moves, end_decode); any other move goes through the K-shift at the start of the llama_decode */
static int32_t move_keys(struct farctx_session * s, int64_t pos, int32_t n_tokens) {
    (void) n_tokens;
    if (graph_moves(s, pos) > 0) {
        return FARCTX_OK;
    }
    const int64_t to = far_below(s, pos), from = farctx_key_layout_of(s)->layout;
    return farctx_key_layout_move(s, from < to ? from : to, pos, rule_of(s)->moved, to);  /* keys between from and to */
}

/* after the llama_decode of a batch at s->n_past: the keys its graph rotated are where the layout says */
static void moved_in_graph(struct farctx_session * s, bool computed) {
    if (computed && s->active.n_k_move > 0) {
        farctx_key_layout_of(s)->layout = far_below(s, s->n_past);
    }
}

/* -- the methods -------------------------------------------------------------------------------------- */

static int32_t lminf_validate(const struct farctx_params * p, char * err, size_t err_size) {
    if (p->n_global >= p->n_local) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                           "n_global (%d) must be smaller than n_local (%d)", p->n_global, p->n_local);
    }
    return FARCTX_OK;
}

/* sinks plus window fill the trained context */
static int32_t streaming_local_default(const struct farctx_params * p) {
    return p->n_ctx_train - p->n_sink;
}

static int32_t selfextend_validate(const struct farctx_params * p, char * err, size_t err_size) {
    if (p->neighbor < 1 || p->neighbor >= p->n_ctx_train) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                           "neighbor (%d) must be between 1 and n_ctx_train - 1 (%d)", p->neighbor, p->n_ctx_train - 1);
    }
    return FARCTX_OK;
}

static int32_t selfextend_init(struct farctx_session * s, char * err, size_t err_size) {
    if (s->params.group <= 0) {
        /* groups wide enough that the whole cache maps inside the trained context */
        const int64_t W = s->params.neighbor, L = s->params.n_ctx_train, n = llama_n_ctx_seq(s->ctx);
        const int64_t G = n > W ? (n - W + (L - W) - 1) / (L - W) : 1;
        s->params.group = (int32_t) (G > 1 ? G : 1);
    }
    return FARCTX_OK;
}

/* STRING's defaults (the reference's replace_with_string and its RULER scripts): S = 0.33 L, W = 128; W at most S / 2
 * where the trained context is short */
static void string_resolve(struct farctx_params * p) {
    if (p->shifted_offset <= 0) {
        p->shifted_offset = (int32_t) ((int64_t) p->n_ctx_train * 33 / 100);
    }
    if (p->local_value <= 0) {
        p->local_value = p->shifted_offset / 2 < 128 ? p->shifted_offset / 2 : 128;
    }
}

static int32_t string_validate(const struct farctx_params * p, char * err, size_t err_size) {
    if (p->shifted_offset < 2 || p->shifted_offset >= p->n_ctx_train) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "shifted_offset (%d) must be between 2 and n_ctx_train - 1 "
                           "(%d)", p->shifted_offset, p->n_ctx_train - 1);
    }
    if (p->local_value < 1 || p->local_value >= p->shifted_offset) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "local_value (%d) must be between 1 and shifted_offset - 1 "
                           "(%d)", p->local_value, p->shifted_offset - 1);
    }
    return FARCTX_OK;
}

/* the reference's factor on its rotary tables, 0.1 ln 2 + 1, on queries and keys alike: (0.1 ln 2 + 1)^2 on a logit */
#define STRING_LOGIT_SCALE 1.14343397f

static const struct window_rule k_lminf       = { FARCTX_PARAM_N_LOCAL,  false, SEG2_HEAD, q2_bounded,    k2_zero,    0,
                                                  NULL };
static const struct window_rule k_window      = { FARCTX_PARAM_N_LOCAL,  false, SEG2_NONE, NULL,          NULL,       0,
                                                  NULL };
static const struct window_rule k_lambda_only = { FARCTX_PARAM_N_LOCAL,  true,  SEG2_NONE, NULL,          NULL,       0,
                                                  NULL };
static const struct window_rule k_rerope      = { FARCTX_PARAM_N_LOCAL,  false, SEG2_ALL,  q2_bounded,    k2_zero,    0,
                                                  rerope_moved };
static const struct window_rule k_streaming   = { FARCTX_PARAM_N_LOCAL,  false, SEG2_HEAD, q2_cache_slot, k2_true,    0,
                                                  NULL };
static const struct window_rule k_selfextend  = { FARCTX_PARAM_NEIGHBOR, false, SEG2_ALL,  q2_grouped,    k2_grouped, 0,
                                                  selfextend_moved };
static const struct window_rule k_string      = { FARCTX_PARAM_SHIFTED_OFFSET, false, SEG2_ALL, q2_shifted, k2_true,
                                                  STRING_LOGIT_SCALE, NULL };

#define WINDOW_OPS .setup = setup, .plain_below = plain_below, .batch_params = batch_params
/* the rules whose keys move to where the second segment reads them */
#define KEYS_OPS .before_decode = move_keys, .end_decode = moved_in_graph, FARCTX_KEY_LAYOUT_OPS

const struct farctx_method_ops farctx_lminf_ops = {
    WINDOW_OPS, .first_needed = first_needed, .validate = lminf_validate, .rule = &k_lminf };
const struct farctx_method_ops farctx_window_ops = {
    WINDOW_OPS, .first_needed = first_needed, .rule = &k_window };
const struct farctx_method_ops farctx_lambda_only_ops = {
    WINDOW_OPS, .first_needed = first_needed, .rule = &k_lambda_only };
const struct farctx_method_ops farctx_rerope_ops = {
    WINDOW_OPS, KEYS_OPS, .rule = &k_rerope };
const struct farctx_method_ops farctx_streaming_ops = {
    WINDOW_OPS, .first_needed = first_needed, .local_default = streaming_local_default, .rule = &k_streaming };
const struct farctx_method_ops farctx_selfextend_ops = {
    WINDOW_OPS, KEYS_OPS, .validate = selfextend_validate, .init = selfextend_init, .rule = &k_selfextend };
const struct farctx_method_ops farctx_string_ops = {
    WINDOW_OPS, .resolve = string_resolve, .validate = string_validate, .rule = &k_string };

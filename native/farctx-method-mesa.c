/*
 * farctx: Mesa-Extrapolation (docs/methods.md 1.2): the chunk schedule of a prompt, the stair position map,
 * and the per-ubatch mask/deltas/query scale.
 *
 *   first chunk [0, F):            vanilla
 *   middle chunk k [s_k, s_k + C): sees the first chunk and itself; placed right after the first chunk.
 *                                  The graph reads only its own cells (true positions) as the main
 *                                  segment and the first chunk as the second one, those F keys moved
 *                                  forward by s_k - F: the same relative positions as moving the query
 *                                  and the own keys back by s_k - F, without rotating the cache
 *   last chunk [F + N C, n) and every later token: sees everything, keys at stair positions g(j)
 *                                  (once n_kv > L_tr), query at its true index, scaled by
 *                                  max(1, ln(i+1) / ln(L_tr)). A batch of at most MESA_IN_PLACE_MAX
 *                                  tokens from S - 1 on (every generated token) reads the cache as is:
 *                                  before, the cached keys are rotated in place to the stair
 *                                  (llama_memory_seq_rotate_k), again only when the boundary moves
 *                                  (every C tokens); the cell positions stay true. Any other batch of
 *                                  the last chunk (a prompt's ubatches) rotates a copy of the keys in its
 *                                  own graph, from where the cache holds them to the stair: no K-shift
 *                                  graph of its own, and no split at S - 1
 */
#include "farctx-impl.h"

#include <math.h>
#include <string.h>

/* from S - 1 on, a batch of at most this many tokens (generated tokens) reads the cache rotated in place: the
 * rotation is paid once per C tokens instead of in every graph. A larger batch rotates a copy of the keys in its
 * own graph (n_kv x n_head_kv x head_dim per layer, under 1/30 of the attention it feeds), which spares a
 * K-shift graph (a graph of its own, built on the host) per stair move and the split at S - 1 */
#define MESA_IN_PLACE_MAX 16

/* the plan of the current prompt and the cache's rotation (per session: no module-level state) */
struct farctx_mesa {
    bool    planned;
    bool    chunked;        /* the prompt is past L_tr - gen_budget            */
    int64_t n;              /* prompt length                                   */
    int64_t C;              /* chunk width                                     */
    int64_t N;              /* middle chunks                                   */
    int64_t last_S;         /* stair boundary of the last ubatch (-1: none)    */
    int32_t n_stair_moves;  /* times the boundary moved forward                */
    /* generated tokens (batches of at most MESA_IN_PLACE_MAX from S - 1 on) read the cache as is, its keys
     * rotated in place to their stair positions; larger batches read them through key deltas from there. rot_S: the stair boundary the cached keys sit at (key j
     * at stair_pos(j, rot_S); 0: true positions). It holds for every cell: cells are written at or above
     * rot_S - 1, where the stair is the identity (rotate_cache keeps rot_S <= pos + 1), and a rewind only
     * removes cells */
    int64_t rot_S;
    int32_t n_cache_rotations; /* times the cache was rotated in place         */
};

static struct farctx_mesa * mesa_of(const struct farctx_session * s) {
    return (struct farctx_mesa *) s->state;
}

static void plan(struct farctx_session * s, int64_t n) {
    const struct farctx_params * p = &s->params;
    struct farctx_mesa * m = mesa_of(s);
    const int64_t F  = p->first_chunk;
    const int64_t C0 = p->n_ctx_train - 2 * F;

    m->planned = true;
    m->n       = n;
    m->C       = C0;
    m->N       = 0;
    m->chunked = n >= p->n_ctx_train - p->gen_budget;
    m->last_S  = -1;
    if (!m->chunked) {
        return;  /* fits the trained context (with the generation budget): vanilla */
    }
    /* the authors' split rule; no assert on awkward lengths: the remainder joins the last chunk */
    const int64_t T = n + p->gen_budget - p->last_context - F;
    if (T <= 0) {
        return;
    }
    int64_t N = T / C0, C = C0;
    if (T % C0 >= 200) {
        C = T / (N + 1);
        N = T / C;
    }
    m->C = C;
    m->N = N;
}

bool farctx_mesa_schedule(const struct farctx_params * params, int64_t n, int64_t * chunk, int64_t * n_middle) {
    struct farctx_mesa m = { 0 };
    struct farctx_session s = { 0 };
    s.params = *params;
    s.state  = &m;
    farctx_params_resolve(&s.params, NULL);
    plan(&s, n);
    *chunk    = m.C;
    *n_middle = m.N;
    return m.chunked;
}

/* the regime of query i, and what it needs */
struct mesa_row {
    int     kind;     /* 0 vanilla, 1 middle chunk, 2 stair (last chunk / later tokens) */
    int64_t s_k;      /* middle: chunk start          */
    int64_t S;        /* stair: first exact key       */
};

static struct mesa_row mesa_row(const struct farctx_session * s, int64_t i) {
    const struct farctx_params * p = &s->params;
    const struct farctx_mesa * m = mesa_of(s);
    struct mesa_row r = { 0, 0, 0 };
    const int64_t F = p->first_chunk;
    if (m->chunked && i < m->n) {
        if (i < F) {
            return r;
        }
        if (i < F + m->N * m->C) {
            r.kind = 1;
            r.s_k  = F + ((i - F) / m->C) * m->C;
            return r;
        }
    } else if (i < m->n) {
        return r;  /* an unchunked prompt */
    }
    const int64_t n_kv = (m->chunked && i < m->n) ? m->n : i + 1;
    if (n_kv <= p->n_ctx_train) {
        return r;  /* inside the trained context: plain positions */
    }
    r.kind = 2;
    r.S    = n_kv - ((n_kv - 1) % m->C);
    return r;
}

static int64_t stair_pos(int64_t j, int64_t S, int64_t E) {
    return j >= S ? j : (S - 1) - (S - 1 - j) / E;
}

static int64_t segment_end(const struct farctx_session * s, int64_t i, int32_t n_left) {
    (void) n_left;
    const struct farctx_params * p = &s->params;
    const struct farctx_mesa * m = mesa_of(s);
    const int64_t F = p->first_chunk;
    if (m->chunked && i < F) {
        return F;
    }
    if (m->chunked && i < F + m->N * m->C) {
        return F + ((i - F) / m->C + 1) * m->C;
    }
    if (i < m->n) {
        return m->n;  /* an unchunked prompt, or a chunked one's last chunk: one n_kv (the prompt's), one stair */
    }
    /* later tokens: the stair boundary moves when (n_kv - 1) mod C wraps, and starts once n_kv > L_tr */
    int64_t end = (i / m->C + 1) * m->C;
    if (i < p->n_ctx_train && p->n_ctx_train < end) {
        end = p->n_ctx_train;
    }
    return end;
}

/* a small batch in the stair regime whose own keys (positions >= pos) all sit at their true positions (g(j) = j
 * from S - 1 on): the cache holds the stair, the graph reads it as is. Every generated token (S <= i + 1) */
static bool stair_in_place(struct mesa_row r, int64_t pos, int32_t n_tokens) {
    return r.kind == 2 && pos >= r.S - 1 && n_tokens <= MESA_IN_PLACE_MAX;
}

/* where the stair of boundary S keeps key j, relative to its true position (S = 0: true positions) */
static int64_t stair_offset(const struct farctx_params * p, int64_t S, int64_t j) {
    return stair_pos(j, S, p->stair_width) - j;
}

static int32_t rotate_cache(struct farctx_session * s, int64_t pos, int32_t n_tokens) {
    struct farctx_mesa * m = mesa_of(s);
    const struct mesa_row r = mesa_row(s, pos);
    int64_t S = 0;  /* the stair the cache should hold for this batch; 0: true positions */
    if (stair_in_place(r, pos, n_tokens)) {
        S = r.S;
    } else if (r.kind == 2 && m->rot_S <= pos + 1) {
        return FARCTX_OK;  /* key deltas from where the cache holds the keys; its new cells are exact */
    }
    /* otherwise the graph reads true positions: the stock graph, a middle chunk (or a rewind below rot_S) */
    if (S == m->rot_S) {
        return FARCTX_OK;  /* the usual case: nothing to do until the stair moves (every C tokens) */
    }
    bool moved = false;
    const int32_t rc = farctx_session_move_keys(s, 0, pos, stair_offset, m->rot_S, S, &moved);
    if (rc != FARCTX_OK) {
        return rc;
    }
    m->rot_S = S;
    m->n_cache_rotations += moved;
    return FARCTX_OK;
}

static void batch_params(const struct farctx_session * s, int64_t pos, int32_t n_tokens, struct llama_attn_extrap_params * ex) {
    const struct mesa_row r = mesa_row(s, pos);
    if (stair_in_place(r, pos, n_tokens)) {
        ex->use_k_delta = false;  /* rotate_cache put the keys at their stair positions */
        return;
    }
    if (r.kind != 1) {
        return;  /* the session's settings: one segment, key deltas, query scale */
    }
    ex->n_seg2      = s->params.first_chunk;
    ex->kv_first    = (int32_t) r.s_k;  /* a prompt fills the cache in order from cell 0 (checked by the fill) */
    ex->use_q_delta = false;
    ex->use_k_delta = false;
    ex->use_q_scale = false;
}

/* a middle chunk through two segments: its own cells (the main segment starts at the chunk's first
 * cell), and the first chunk moved next to it */
static int32_t fill_middle(struct farctx_session * s, struct llama_attn_extrap_ubatch * ub, struct mesa_row r) {
    const int64_t F = s->params.first_chunk;
    for (int32_t t = 0; t < ub->n_tokens; ++t) {
        const int64_t i = ub->q_pos[t];
        float * row = ub->mask + (size_t) t * ub->n_kv;
        int64_t n_own = 0;
        for (int32_t c = 0; c < ub->n_kv; ++c) {
            const int64_t j = ub->kv_pos[c];
            const bool ok = j >= r.s_k && j <= i;
            row[c] = ok ? 0.0f : -INFINITY;
            n_own += ok;
        }
        float * row2 = ub->seg2_mask + (size_t) t * ub->n_seg2;
        int64_t n_first = 0;
        for (int32_t c = 0; c < ub->n_seg2; ++c) {
            const int64_t j = ub->seg2_pos[c];
            row2[c] = (j >= 0 && j < F) ? 0.0f : -INFINITY;
            n_first += j >= 0 && j < F;
        }
        /* every key the query needs must be in view: the cache was filled in order from cell 0 */
        if (n_own != i - r.s_k + 1 || n_first != F) {
            s->fill_error = true;
            farctx_session_fail(s, FARCTX_ERR_PARAM, "mesa: query %lld sees %lld of its chunk's %lld keys and %lld "
                                "of the first chunk's %lld (the cache was not filled in order from cell 0)",
                                (long long) i, (long long) n_own, (long long) (i - r.s_k + 1),
                                (long long) n_first, (long long) F);
            return 1;
        }
        ub->seg2_q_delta[t] = 0;
    }
    for (int32_t c = 0; c < ub->n_seg2; ++c) {
        ub->seg2_k_delta[c] = (int32_t) (r.s_k - F);
    }
    return 0;
}

static int32_t fill(void * user_data, struct llama_attn_extrap_ubatch * ub) {
    struct farctx_session * s = (struct farctx_session *) user_data;
    const struct farctx_params * p = &s->params;
    const struct mesa_row r = mesa_row(s, ub->q_pos[0]);
    const double log_train = log((double) p->n_ctx_train);

    for (int32_t t = 0; t < ub->n_tokens; ++t) {
        const int64_t i = ub->q_pos[t];
        const struct mesa_row rt = mesa_row(s, i);
        if (rt.kind != r.kind || rt.s_k != r.s_k || rt.S != r.S) {
            /* the driver splits batches at segment ends, so this means a caller decoded on its own */
            s->fill_error = true;
            farctx_session_fail(s, FARCTX_ERR_PARAM, "mesa: a ubatch mixes chunks (positions %lld and %lld): "
                                "feed the stream through farctx_session_feed", (long long) ub->q_pos[0], (long long) i);
            return 1;
        }
    }
    /* the settings of batch_params: two segments for a middle chunk, the scale and key deltas
     * otherwise (no key deltas where the cache holds this batch's stair) */
    struct farctx_mesa * m = mesa_of(s);
    const bool in_place = r.kind == 2 && ub->q_pos[0] >= r.S - 1 && m->rot_S == r.S;
    if (r.kind == 1 ? ub->n_seg2 <= 0 : (ub->q_scale == NULL || (ub->k_delta == NULL && !in_place))) {
        s->fill_error = true;
        farctx_session_fail(s, FARCTX_ERR_PARAM, "mesa: the context's attention settings do not match the chunk at "
                            "%lld (set them per batch as farctx_session_feed does)", (long long) ub->q_pos[0]);
        return 1;
    }
    if (r.kind == 1) {
        return fill_middle(s, ub, r);
    }
    for (int32_t t = 0; t < ub->n_tokens; ++t) {
        const int64_t i = ub->q_pos[t];
        float * row = ub->mask + (size_t) t * ub->n_kv;
        for (int32_t c = 0; c < ub->n_kv; ++c) {
            const int64_t j = ub->kv_pos[c];
            row[c] = (j >= 0 && j <= i) ? 0.0f : -INFINITY;
        }
        const double lam = log((double) i + 1.0) / log_train;
        ub->q_scale[t] = (r.kind == 2 && lam > 1.0) ? (float) lam : 1.0f;
    }
    /* from where the cache holds key j (stair_pos(j, rot_S), exact for the cells written since) to where this
     * batch reads it */
    for (int32_t c = 0; ub->k_delta != NULL && c < ub->n_kv; ++c) {
        const int64_t j = ub->kv_pos[c];
        int64_t delta = 0;
        if (j >= 0) {
            delta = (r.kind == 2 ? stair_pos(j, r.S, p->stair_width) : j) - stair_pos(j, m->rot_S, p->stair_width);
        }
        ub->k_delta[c] = (int32_t) delta;
    }
    if (r.kind == 2 && r.S != m->last_S) {
        if (m->last_S >= 0) {
            m->n_stair_moves++;  /* (n_kv - 1) mod C wrapped: the stair moved forward by C */
        }
        m->last_S = r.S;
    }
    return 0;
}

/* -- the method's operations ------------------------------------------------------------------------- */

static int32_t validate(const struct farctx_params * p, char * err, size_t err_size) {
    if (p->n_ctx_train - 2 * p->first_chunk < 1) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                           "first_chunk (%d) must be below half of n_ctx_train (%d): the chunk width is "
                           "n_ctx_train - 2 first_chunk", p->first_chunk, p->n_ctx_train);
    }
    return FARCTX_OK;
}

static void setup(struct farctx_session * s, struct llama_attn_extrap_params * out) {
    *out = llama_attn_extrap_default_params();
    out->mode      = LLAMA_ATTN_EXTRAP_CUSTOM;
    out->fill      = fill;
    out->user_data = (void *) s;
    /* the last chunk and decoding: keys at stair positions, log-n query scale (middle chunks: batch_params) */
    out->use_k_delta = true;
    out->use_q_scale = true;
}

static int64_t plain_below(const struct farctx_session * s) {
    /* a chunked prompt: its first chunk; otherwise until the cache passes the trained context (then stair
     * positions and the log-n scale start) */
    return mesa_of(s)->chunked ? s->params.first_chunk : s->params.n_ctx_train;
}

static void begin_feed(struct farctx_session * s, int32_t n_tokens) {
    if (s->n_past == 0 || !mesa_of(s)->planned) {
        plan(s, s->n_past == 0 ? n_tokens : s->n_past);  /* the prompt is the first feed */
    }
}

static int32_t rewind_to(struct farctx_session * s, int64_t n_keep) {
    struct farctx_mesa * m = mesa_of(s);
    if (m->planned && m->chunked && n_keep > 0 && n_keep < m->n) {
        return farctx_session_fail(s, FARCTX_ERR_REPLAY,
            "cannot rewind to %lld inside a chunked prompt of %lld tokens: feed it again from the start",
            (long long) n_keep, (long long) m->n);
    }
    if (n_keep == 0) {
        m->planned = false;  /* the next feed is a new prompt */
    }
    return FARCTX_OK;
}

static void stats(const struct farctx_session * s, struct farctx_stats * st) {
    st->n_stair_moves     = mesa_of(s)->n_stair_moves;
    st->n_cache_rotations = mesa_of(s)->n_cache_rotations;
    st->n_prompt_planned  = mesa_of(s)->planned ? mesa_of(s)->n : 0;
}

/* what farctx_session_state_get keeps of the plan and the stair */
struct mesa_saved {
    int32_t planned, chunked, n_stair_moves, n_cache_rotations;
    int64_t n, C, N, last_S, rot_S;
};

static size_t state_write(const struct farctx_session * s, uint8_t * dst) {
    if (dst != NULL) {
        const struct farctx_mesa * m = mesa_of(s);
        struct mesa_saved v;
        memset(&v, 0, sizeof(v));
        v.planned = m->planned; v.chunked = m->chunked;
        v.n_stair_moves = m->n_stair_moves; v.n_cache_rotations = m->n_cache_rotations;
        v.n = m->n; v.C = m->C; v.N = m->N; v.last_S = m->last_S; v.rot_S = m->rot_S;
        memcpy(dst, &v, sizeof(v));
    }
    return sizeof(struct mesa_saved);
}

static int32_t state_read(struct farctx_session * s, const uint8_t * src, size_t n) {
    if (n != sizeof(struct mesa_saved)) {
        return farctx_session_fail(s, FARCTX_ERR_PARAM, "not a mesa stream state (%zu bytes)", n);
    }
    struct mesa_saved v;
    memcpy(&v, src, sizeof(v));
    struct farctx_mesa * m = mesa_of(s);
    m->planned = v.planned != 0; m->chunked = v.chunked != 0;
    m->n_stair_moves = v.n_stair_moves; m->n_cache_rotations = v.n_cache_rotations;
    m->n = v.n; m->C = v.C; m->N = v.N; m->last_S = v.last_S; m->rot_S = v.rot_S;
    return FARCTX_OK;
}

const struct farctx_method_ops farctx_mesa_ops = {
    .validate      = validate,
    .state_size    = sizeof(struct farctx_mesa),
    .setup         = setup,
    .plain_below   = plain_below,
    .begin_feed    = begin_feed,
    .segment_end   = segment_end,
    .batch_params  = batch_params,
    .before_decode = rotate_cache,
    .rewind        = rewind_to,
    .stats         = stats,
    .state_write   = state_write,
    .state_read    = state_read,
};

/* farctx: a stream's session: made (with the checks of its cache), rewound, counted, freed. Fed: farctx-feed.c;
 * saved and loaded: farctx-state.c */
#include "farctx-impl.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

struct farctx_session * farctx_session_init(struct llama_context * ctx, const struct farctx_params * params,
                                            char * err, size_t err_size) {
    return farctx_session_init_seq(ctx, params, 0, err, err_size);
}

struct farctx_session * farctx_session_init_seq(struct llama_context * ctx, const struct farctx_params * params,
                                                int32_t seq_id, char * err, size_t err_size) {
    if (ctx == NULL) {
        farctx_fail(err, err_size, FARCTX_ERR_PARAM, "no llama_context");
        return NULL;
    }
    if (seq_id < 0 || (uint32_t) seq_id >= llama_n_seq_max(ctx)) {
        farctx_fail(err, err_size, FARCTX_ERR_PARAM, "sequence %d is not in the context (it has %u: 0 .. %u)",
                    seq_id, llama_n_seq_max(ctx), llama_n_seq_max(ctx) - 1);
        return NULL;
    }
    struct farctx_params defaults = farctx_default_params();
    if (params == NULL) {
        params = &defaults;
    }
    const struct llama_model * model = llama_get_model(ctx);
    /* the model first: no parameter makes a method run on a model it cannot run on (auto runs vanilla there) */
    char why[FARCTX_ERR_LEN];
    struct farctx_params runs = *params;
    runs.method = farctx_method_for_model(params->method, model, NULL, 0);
    params = &runs;
    const int32_t supported = farctx_method_supported(params->method, model, why, sizeof(why));
    if (supported == FARCTX_ERR_PARAM) {  /* not a method at all */
        farctx_fail(err, err_size, FARCTX_ERR_PARAM, "%s", why);
        return NULL;
    }
    if (supported != FARCTX_OK) {
        farctx_fail(err, err_size, FARCTX_ERR_UNSUPPORTED, "%s cannot run on this model (%s): it needs causal "
                    "attention with RoPE (standard sliding-window layers allowed)", farctx_method_name(params->method), why);
        return NULL;
    }
    if (farctx_params_validate(params, model, err, err_size) != FARCTX_OK) {
        return NULL;
    }
    const struct farctx_method_def * method = farctx_method_def(params->method);

    struct farctx_session * s = calloc(1, sizeof(*s));
    if (s == NULL) {
        farctx_fail(err, err_size, FARCTX_ERR_PARAM, "out of memory");
        return NULL;
    }
    s->ctx    = ctx;
    s->model  = model;
    s->seq    = seq_id;
    s->ops    = method->ops;
    s->params = *params;
    farctx_params_resolve(&s->params, model);
    /* the context's plan: a window left unset fitted to the cache, or the refusal with every size (given after
     * llama.cpp's own checks of the model and the context, below) */
    struct farctx_params asked = *params;  /* n_local 0: unset */
    asked.n_ctx_train = s->params.n_ctx_train;
    struct farctx_plan_params in = farctx_plan_default_params();
    in.n_ctx_train = s->params.n_ctx_train;
    in.n_swa       = llama_model_n_swa(model);
    in.n_ctx       = (int32_t) llama_n_ctx_seq(ctx);
    in.n_batch     = (int32_t) llama_n_batch(ctx);
    in.n_ubatch    = (int32_t) llama_n_ubatch(ctx);
    struct farctx_plan plan;
    char plan_err[FARCTX_ERR_LEN];
    const int32_t planned = farctx_context_plan(&asked, &in, &plan, plan_err, sizeof(plan_err));
    if (planned == FARCTX_OK && plan.window_fitted) {
        s->params.n_local = plan.n_local;
        s->window_fitted  = true;
    }
    if (s->ops->state_size > 0 && (s->state = calloc(1, s->ops->state_size)) == NULL) {
        farctx_fail(err, err_size, FARCTX_ERR_PARAM, "out of memory");
        free(s);
        return NULL;
    }
    if (s->ops->init != NULL && s->ops->init(s, err, err_size) != FARCTX_OK) {
        free(s->state);
        free(s);
        return NULL;
    }

    struct llama_attn_extrap_params ex;
    s->ops->setup(s, &ex);
    s->custom = ex;
    s->active = ex;
    const int32_t rc = llama_set_attn_extrap(ctx, &ex);  /* llama.cpp's own check of the model and context */
    if (rc != LLAMA_ATTN_EXTRAP_OK) {
        farctx_fail(err, err_size, FARCTX_ERR_UNSUPPORTED, "%s cannot run here: %s",
            method->info.name,
            rc == LLAMA_ATTN_EXTRAP_ERR_MODEL   ? "this model architecture is not supported (needs a causal RoPE model: "
                                                  "no recurrent, MLA, M-RoPE, chunked or symmetric sliding-window "
                                                  "layers)" :
            rc == LLAMA_ATTN_EXTRAP_ERR_CONTEXT ? "the context holds several sequences in one unified KV cache "
                                                  "(use kv_unified = false: one stream per sequence)" :
                                                  "llama.cpp refused the attention parameters");
        free(s->state);
        free(s);
        return NULL;
    }

    if (planned != FARCTX_OK) {
        farctx_fail(err, err_size, planned, "%s", plan_err);
        farctx_session_free(s);
        return NULL;
    }

    /* the stream starts empty: whatever its sequence held before is not part of it */
    llama_memory_seq_rm(llama_get_memory(ctx), seq_id, -1, -1);
    return s;
}

bool farctx_session_fixed_cache(const struct farctx_session * s) {
    return farctx_method_fixed_cache(s->params.method);
}

int64_t farctx_session_first_needed(const struct farctx_session * s, int64_t next_pos) {
    return s->ops->first_needed != NULL ? s->ops->first_needed(&s->params, next_pos) : 0;
}

void farctx_session_free(struct farctx_session * session) {
    if (session == NULL) {
        return;
    }
    /* the context may outlive the session: leave it with the stock graph, unless it runs another session's
     * settings (several sequences) */
    const struct llama_attn_extrap_params cur = llama_get_attn_extrap(session->ctx);
    if (cur.user_data == (void *) session || cur.mode == LLAMA_ATTN_EXTRAP_NONE) {
        struct llama_attn_extrap_params none = llama_attn_extrap_default_params();
        llama_set_attn_extrap(session->ctx, &none);
    }
    free(session->state);
    free(session->k_step);
    free(session);
}

int32_t farctx_session_move_keys(struct farctx_session * s, int64_t first, int64_t pos, farctx_key_offset_fn offset,
                                 int64_t from, int64_t to, bool * moved) {
    *moved = false;
    if (s->k_step == NULL && (s->k_step = calloc(llama_n_ctx_seq(s->ctx), sizeof(int32_t))) == NULL) {
        return farctx_session_fail(s, FARCTX_ERR_DECODE, "out of memory");
    }
    int64_t p0 = -1, p1 = -1;  /* the span of keys that move */
    for (int64_t j = first > 0 ? first : 0; j < pos; ++j) {
        s->k_step[j] = (int32_t) (offset(&s->params, to, j) - offset(&s->params, from, j));
        if (s->k_step[j] != 0) {
            p0 = p0 < 0 ? j : p0;
            p1 = j + 1;
        }
    }
    if (p0 < 0) {
        return FARCTX_OK;
    }
    if (!llama_memory_seq_rotate_k(llama_get_memory(s->ctx), s->seq, (llama_pos) p0, (llama_pos) p1, s->k_step + p0)) {
        return farctx_session_fail(s, FARCTX_ERR_DECODE, "%s: llama.cpp cannot rotate the cached keys in place",
                                   farctx_method_name(s->params.method));
    }
    *moved = true;
    return FARCTX_OK;
}

int32_t farctx_key_layout_move(struct farctx_session * s, int64_t first, int64_t pos, farctx_key_offset_fn offset,
                               int64_t to) {
    struct farctx_key_layout * l = farctx_key_layout_of(s);
    if (to == l->layout) {
        return FARCTX_OK;
    }
    bool moved = false;
    const int32_t rc = farctx_session_move_keys(s, first, pos, offset, l->layout, to, &moved);
    if (rc != FARCTX_OK) {
        return rc;
    }
    l->n_cache_rotations += moved;
    l->layout = to;
    return FARCTX_OK;
}

int32_t farctx_session_rewind(struct farctx_session * s, int64_t n_keep) {
    if (s == NULL) {
        return FARCTX_ERR_PARAM;
    }
    if (n_keep < 0 || n_keep > s->n_past) {
        return farctx_session_fail(s, FARCTX_ERR_PARAM, "cannot rewind to %lld: the stream has %lld tokens",
                                   (long long) n_keep, (long long) s->n_past);
    }
    const int32_t head = farctx_params_head(&s->params);
    int64_t needed = farctx_session_first_needed(s, n_keep);
    if (needed < head) {
        needed = head;
    }
    /* the keys [needed, n_keep) must still be there: evicted are [head, evicted_to) */
    if (farctx_session_fixed_cache(s) && needed < s->evicted_to && needed < n_keep) {
        return farctx_session_fail(s, FARCTX_ERR_REPLAY,
            "cannot rewind to %lld: the keys it needs left the cache (positions up to %lld were evicted)",
            (long long) n_keep, (long long) s->evicted_to - 1);
    }
    /* sliding-window layers (iSWA): their cache reuses the cells its window passed, so the keys that
     * a query at n_keep reads there, (n_keep - n_swa, n_keep), must still be in it */
    const int32_t n_swa = llama_model_n_swa(s->model);
    if (n_swa > 0 && n_keep < s->n_past && n_keep > 0) {
        const llama_pos pos_min = llama_memory_seq_pos_min(llama_get_memory(s->ctx), s->seq);
        const int64_t   first   = n_keep - n_swa + 1 > 0 ? n_keep - n_swa + 1 : 0;
        if (pos_min > first) {
            return farctx_session_fail(s, FARCTX_ERR_REPLAY,
                "cannot rewind to %lld: the sliding-window layers' cache no longer holds position %lld "
                "(it starts at %d)", (long long) n_keep, (long long) first, pos_min);
        }
    }
    if (s->ops->rewind != NULL) {
        const int32_t rc = s->ops->rewind(s, n_keep);
        if (rc != FARCTX_OK) {
            return rc;
        }
    }
    /* the cache holds no position from n_past on (a failed decode removes its own: chunk_failed), so a rewind to
     * the stream's own length (what farctx.Llama.eval asks before every call) leaves the cells alone: seq_rm scans
     * every cell of the cache, 100 k instructions per generated token on a fixed cache of 8,458 cells */
    if (n_keep < s->n_past || n_keep == 0) {
        llama_memory_seq_rm(llama_get_memory(s->ctx), s->seq, (llama_pos) n_keep, -1);
    }
    s->n_past = n_keep;
    if (n_keep <= head) {
        s->evicted_to = 0;  /* only head tokens remain: nothing of the stream is missing */
    }
    return FARCTX_OK;
}

void farctx_session_stats(const struct farctx_session * s, struct farctx_stats * stats) {
    memset(stats, 0, sizeof(*stats));
    if (s == NULL) {
        return;
    }
    llama_memory_t mem = llama_get_memory(s->ctx);
    stats->n_past       = s->n_past;
    stats->n_ctx        = (int32_t) llama_n_ctx_seq(s->ctx);
    stats->n_cells_used = llama_n_seq_max(s->ctx) > 1 ? llama_memory_seq_n_cells_used(mem, s->seq)
                                                      : llama_memory_n_cells_used(mem);
    stats->n_ctx_train  = s->params.n_ctx_train;
    stats->n_decode     = s->n_decode;
    stats->kv_bytes     = llama_memory_n_bytes(mem);
    stats->n_local       = farctx_session_fixed_cache(s) ? s->params.n_local : 0;
    stats->window_fitted = s->window_fitted;
    if (s->ops->stats != NULL) {
        s->ops->stats(s, stats);
    }
}

struct farctx_params farctx_session_params(const struct farctx_session * s) {
    return s ? s->params : farctx_default_params();
}

/* row[c] = 0 for the cells c in [a, b), -inf elsewhere (a and b clamped to the row) */
void farctx_mask_run(float * row, int32_t n, int64_t a, int64_t b) {
    a = a < 0 ? 0 : a > n ? n : a;
    b = b < a ? a : b > n ? n : b;
    for (int64_t c = 0; c < a; ++c) {
        row[c] = -INFINITY;
    }
    for (int64_t c = a; c < b; ++c) {
        row[c] = 0.0f;
    }
    for (int64_t c = b; c < n; ++c) {
        row[c] = -INFINITY;
    }
}

/* the cells in position order: cells [0, m) hold positions p0, p0 + 1, ... and the rest are empty (a stream fed in
 * order, as farctx feeds it). Returns m and sets *p0, or returns -1 */
int32_t farctx_cells_in_order(const int32_t * kv_pos, int32_t n_kv, int64_t * p0) {
    int32_t m = 0;
    *p0 = n_kv > 0 ? kv_pos[0] : 0;
    while (m < n_kv && kv_pos[m] >= 0 && kv_pos[m] == *p0 + m) {
        ++m;
    }
    for (int32_t c = m; c < n_kv; ++c) {
        if (kv_pos[c] >= 0) {
            return -1;
        }
    }
    return m;
}

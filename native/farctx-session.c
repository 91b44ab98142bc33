/* farctx: a token stream through a llama_context under one method (the driver) */
#include "farctx-impl.h"

#include <stdlib.h>
#include <string.h>

struct farctx_session * farctx_session_init(struct llama_context * ctx, const struct farctx_params * params,
                                            char * err, size_t err_size) {
    if (ctx == NULL) {
        farctx_fail(err, err_size, FARCTX_ERR_PARAM, "no llama_context");
        return NULL;
    }
    struct farctx_params defaults = farctx_default_params();
    if (params == NULL) {
        params = &defaults;
    }
    const struct llama_model * model = llama_get_model(ctx);
    /* the model first: no parameter makes a method run on a model it cannot run on */
    char why[FARCTX_ERR_LEN];
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
    s->ops    = method->ops;
    s->params = *params;
    farctx_params_resolve(&s->params, model);
    if (s->ops->init != NULL && s->ops->init(s, err, err_size) != FARCTX_OK) {
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
            rc == LLAMA_ATTN_EXTRAP_ERR_CONTEXT ? "the context holds several sequences (use n_seq_max = 1)" :
                                                  "llama.cpp refused the attention parameters");
        if (s->ops->free != NULL) {
            s->ops->free(s);
        }
        free(s);
        return NULL;
    }

    if (method->info.fixed_cache) {
        const int32_t head = farctx_params_head(&s->params);
        const int64_t need = farctx_cache_cells(&s->params, s->params.n_ctx_train, (int32_t) llama_n_ubatch(ctx), 0, 0);
        if ((int64_t) llama_n_ctx(ctx) < need) {
            farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                "the KV cache holds %u cells, %s needs %s + n_local + n_ubatch = %d + %d + %u = %lld: "
                "enlarge it (-c / n_ctx) or lower n_local / n_ubatch", llama_n_ctx(ctx), method->info.name,
                method->info.head_param >= 0 ? farctx_param_get_info(method->info.head_param).name : "0",
                head, s->params.n_local, llama_n_ubatch(ctx), (long long) need);
            farctx_session_free(s);
            return NULL;
        }
    }

    /* a fixed cache on sliding-window layers (iSWA): llama.cpp sizes their cache min(n_ctx, n_swa + n_ubatch)
     * cells, and a stream longer than the cache only finds room there for a ubatch once n_swa + n_ubatch cells
     * exist (every cell inside the window is in use). A whole-stream cache holds the stream in both. (A
     * fixed-cache method got here only on a model llama_model_attn_extrap_supported accepts.) */
    const int32_t n_swa = llama_model_n_swa(model);
    if (method->info.fixed_cache && n_swa > 0 &&
            (int64_t) llama_n_ctx(ctx) < (int64_t) n_swa + llama_n_ubatch(ctx)) {
        farctx_fail(err, err_size, FARCTX_ERR_PARAM,
            "the KV cache holds %u cells, and this model's sliding-window layers need their window + n_ubatch = "
            "%d + %u = %lld (llama.cpp caps their cache at the context size): enlarge it (-c / n_ctx) or lower "
            "n_ubatch", llama_n_ctx(ctx), n_swa, llama_n_ubatch(ctx), (long long) n_swa + llama_n_ubatch(ctx));
        farctx_session_free(s);
        return NULL;
    }

    /* the stream starts empty: whatever seq 0 held before is not part of it */
    llama_memory_seq_rm(llama_get_memory(ctx), 0, -1, -1);
    return s;
}

static bool fixed_cache(const struct farctx_session * s) {
    return farctx_method_fixed_cache(s->params.method);
}

static int64_t first_needed(const struct farctx_session * s, int64_t next_pos) {
    return s->ops->first_needed != NULL ? s->ops->first_needed(&s->params, next_pos) : 0;
}

void farctx_session_free(struct farctx_session * session) {
    if (session == NULL) {
        return;
    }
    /* the context may outlive the session: leave it with the stock graph */
    struct llama_attn_extrap_params none = llama_attn_extrap_default_params();
    llama_set_attn_extrap(session->ctx, &none);
    if (session->ops->free != NULL) {
        session->ops->free(session);
    }
    free(session);
}

static int32_t check_space(struct farctx_session * s, int32_t n_tokens) {
    const int64_t n_ctx = llama_n_ctx(s->ctx);
    const int64_t need  = s->n_past + n_tokens;
    if (need > INT32_MAX) {
        return farctx_session_fail(s, FARCTX_ERR_NO_SPACE,
            "the stream would pass %lld tokens: llama.cpp positions are 32-bit (at most %d)",
            (long long) need, INT32_MAX);
    }
    if (fixed_cache(s)) {
        return FARCTX_OK;  /* evicts as it goes */
    }
    if (need > n_ctx) {
        return farctx_session_fail(s, FARCTX_ERR_NO_SPACE,
            "the stream needs %lld cells (%lld already in the cache + %d new tokens) but the KV cache "
            "holds %lld: enlarge the cache (-c / n_ctx) or use a method with a fixed-size cache",
            (long long) need, (long long) s->n_past, n_tokens, (long long) n_ctx);
    }
    return FARCTX_OK;
}

int32_t farctx_session_feed(struct farctx_session * s, const int32_t * tokens, int32_t n_tokens,
                            bool all_logits, float * logits,
                            farctx_progress_cb progress, void * progress_data) {
    if (s == NULL) {
        return FARCTX_ERR_PARAM;
    }
    s->error[0] = '\0';
    if (n_tokens < 0 || (n_tokens > 0 && tokens == NULL)) {
        return farctx_session_fail(s, FARCTX_ERR_PARAM, "invalid token array (n_tokens = %d)", n_tokens);
    }
    if (n_tokens == 0) {
        return FARCTX_OK;
    }

    const struct llama_vocab * vocab = llama_model_get_vocab(s->model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return farctx_session_fail(s, FARCTX_ERR_PARAM,
                "token %d at index %d is outside the vocabulary (0..%d)", tokens[i], i, n_vocab - 1);
        }
    }

    int32_t rc = check_space(s, n_tokens);
    if (rc != FARCTX_OK) {
        return rc;
    }

    const bool fixed = fixed_cache(s);
    const struct farctx_method_ops * ops = s->ops;
    if (ops->begin_feed != NULL) {
        ops->begin_feed(s, n_tokens);
    }
    /* a fixed-size cache evicts between calls: one ubatch per llama_decode */
    const int32_t n_batch = (int32_t) (fixed ? llama_n_ubatch(s->ctx) : llama_n_batch(s->ctx));
    /* sized to this call (one token per call when decoding): llama_batch_init allocates a sequence-id
     * array per slot */
    struct llama_batch batch = llama_batch_init(n_tokens < n_batch ? n_tokens : n_batch, 0, 1);
    llama_memory_t mem = llama_get_memory(s->ctx);

    for (int32_t done = 0; done < n_tokens; ) {
        int32_t n = (n_tokens - done < n_batch) ? n_tokens - done : n_batch;
        if (ops->segment_end != NULL) {  /* one segment of the method per llama_decode */
            const int64_t room = ops->segment_end(s, s->n_past) - s->n_past;
            n = room < n ? (int32_t) room : n;
        }
        const bool last_chunk = done + n == n_tokens;

        batch.n_tokens = n;
        for (int32_t i = 0; i < n; ++i) {
            batch.token[i]     = tokens[done + i];
            batch.pos[i]       = (llama_pos) (s->n_past + i);
            batch.n_seq_id[i]  = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i]    = (all_logits && logits != NULL) || (last_chunk && i == n - 1);
        }

        if (fixed) {
            /* keys that no query from here on reads: positions [n_global, first needed) */
            const int64_t first = first_needed(s, s->n_past);
            const int32_t head = farctx_params_head(&s->params);
            if (first > head && first > s->evicted_to) {
                /* from the full-attention layers' cache only: sliding-window layers (iSWA) keep their own
                 * window, and their cache drops what the window passed by itself */
                llama_memory_seq_rm_base(mem, 0, head, (llama_pos) first);
                s->evicted_to = first;
            }
        }

        /* while every query of the batch sees what vanilla attention shows it, the stock graph runs
         * (one segment, flash attention where enabled): as fast as stock llama.cpp */
        const bool plain = s->n_past + n <= ops->plain_below(s);
        struct llama_attn_extrap_params ex = plain ? llama_attn_extrap_default_params() : s->custom;
        if (!plain && ops->batch_params != NULL) {
            ops->batch_params(s, s->n_past, n, &ex);
        }
        if (!llama_attn_extrap_same_graph(&ex, &s->active)) {
            const int32_t rc = llama_set_attn_extrap(s->ctx, &ex);
            if (rc != LLAMA_ATTN_EXTRAP_OK) {
                llama_batch_free(batch);
                return farctx_session_fail(s, FARCTX_ERR_DECODE, "llama.cpp refused the attention settings "
                                           "at token %lld (code %d)", (long long) s->n_past, rc);
            }
            s->active = ex;
        }

        if (ops->before_decode != NULL) {
            const int32_t rc = ops->before_decode(s, s->n_past);
            if (rc != FARCTX_OK) {
                llama_batch_free(batch);
                return rc;
            }
        }

        s->fill_error = false;
        const int32_t ret = llama_decode(s->ctx, batch);
        s->n_decode++;
        if (s->fill_error) {
            /* the method refused the ubatch (its message is in s->error; llama_decode failed it without
             * computing it): nothing of it stays */
            llama_batch_free(batch);
            llama_memory_seq_rm(mem, 0, (llama_pos) s->n_past, -1);
            return FARCTX_ERR_PARAM;
        }
        if (ret != 0) {
            llama_batch_free(batch);
            /* a failed decode leaves no partial tokens of this batch in the stream */
            llama_memory_seq_rm(llama_get_memory(s->ctx), 0, (llama_pos) s->n_past, -1);
            return farctx_session_fail(s, ret == 1 ? FARCTX_ERR_NO_SPACE : FARCTX_ERR_DECODE,
                "llama_decode failed with code %d at token %lld", ret, (long long) s->n_past);
        }

        if (logits != NULL) {
            for (int32_t i = 0; i < n; ++i) {
                if (!batch.logits[i]) {
                    continue;
                }
                const float * src = llama_get_logits_ith(s->ctx, i);
                float * dst = all_logits ? logits + (size_t) (done + i) * n_vocab : logits;
                memcpy(dst, src, sizeof(float) * (size_t) n_vocab);
            }
        }

        s->n_past += n;
        done      += n;

        if (progress != NULL && !progress(progress_data, done, n_tokens) && done < n_tokens) {
            llama_batch_free(batch);
            return farctx_session_fail(s, FARCTX_ERR_CANCELLED, "cancelled after %d of %d tokens", done, n_tokens);
        }
    }

    llama_batch_free(batch);
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
    int64_t needed = first_needed(s, n_keep);
    if (needed < head) {
        needed = head;
    }
    /* the keys [needed, n_keep) must still be there: evicted are [head, evicted_to) */
    if (fixed_cache(s) && needed < s->evicted_to && needed < n_keep) {
        return farctx_session_fail(s, FARCTX_ERR_REPLAY,
            "cannot rewind to %lld: the keys it needs left the cache (positions up to %lld were evicted)",
            (long long) n_keep, (long long) s->evicted_to - 1);
    }
    /* sliding-window layers (iSWA): their cache reuses the cells its window passed, so the keys that
     * a query at n_keep reads there, (n_keep - n_swa, n_keep), must still be in it */
    const int32_t n_swa = llama_model_n_swa(s->model);
    if (n_swa > 0 && n_keep < s->n_past && n_keep > 0) {
        const llama_pos pos_min = llama_memory_seq_pos_min(llama_get_memory(s->ctx), 0);
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
    llama_memory_seq_rm(llama_get_memory(s->ctx), 0, (llama_pos) n_keep, -1);
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
    stats->n_ctx        = (int32_t) llama_n_ctx(s->ctx);
    stats->n_cells_used = llama_memory_n_cells_used(mem);
    stats->n_ctx_train  = s->params.n_ctx_train;
    stats->n_decode     = s->n_decode;
    stats->kv_bytes     = llama_memory_n_bytes(mem);
    if (s->ops->stats != NULL) {
        s->ops->stats(s, stats);
    }
}

struct farctx_params farctx_session_params(const struct farctx_session * s) {
    return s ? s->params : farctx_default_params();
}

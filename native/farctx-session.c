/* farctx: a token stream through a llama_context under one method (the driver) */
#include "farctx-impl.h"

#include <stdlib.h>
#include <string.h>

struct farctx_session * farctx_session_init(struct llama_context * ctx, const struct farctx_params * params,
                                            char * err, size_t err_size) {
    return farctx_session_init_seq(ctx, params, 0, err, err_size);
}

/* n_local left 0 on a fixed cache that cannot hold the default window: the window is the room the cache leaves
 * (FARCTX_FIT_LOCAL_MIN at least; farctx.h). A cache too small for that keeps the default, which the size check
 * refuses after llama.cpp's own checks of the context */
static int32_t fit_window(struct farctx_session * s, char * err, size_t err_size) {
    const int64_t room = (int64_t) llama_n_ctx_seq(s->ctx) - farctx_params_head(&s->params) - llama_n_ubatch(s->ctx);
    if (room >= s->params.n_local || room < FARCTX_FIT_LOCAL_MIN) {
        return FARCTX_OK;
    }
    s->params.n_local = (int32_t) room;
    s->window_fitted  = true;
    const struct farctx_method_def * method = farctx_method_def(s->params.method);
    return method->ops->validate != NULL ? method->ops->validate(&s->params, err, err_size) : FARCTX_OK;
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
    s->seq    = seq_id;
    s->ops    = method->ops;
    s->params = *params;
    farctx_params_resolve(&s->params, model);
    if (method->info.fixed_cache && params->n_local <= 0 && fit_window(s, err, err_size) != FARCTX_OK) {
        free(s);
        return NULL;
    }
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
            rc == LLAMA_ATTN_EXTRAP_ERR_CONTEXT ? "the context holds several sequences in one unified KV cache "
                                                  "(use kv_unified = false: one stream per sequence)" :
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
        if ((int64_t) llama_n_ctx_seq(ctx) < need && params->n_local <= 0 &&
                s->params.n_local > FARCTX_FIT_LOCAL_MIN) {
            /* the caller's cache as a memory budget, too small even for the smallest window fitted to it */
            farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                "the KV cache holds %u cells, too few for %s: %s + n_local + n_ubatch = %d + %d (the smallest "
                "window fitted to a cache; the default is %d) + %u = %lld: enlarge it (-c / n_ctx) or lower n_ubatch",
                llama_n_ctx_seq(ctx), method->info.name,
                method->info.head_param >= 0 ? farctx_param_get_info(method->info.head_param).name : "0",
                head, (int) FARCTX_FIT_LOCAL_MIN, s->params.n_local, llama_n_ubatch(ctx),
                (long long) head + FARCTX_FIT_LOCAL_MIN + llama_n_ubatch(ctx));
            farctx_session_free(s);
            return NULL;
        }
        if ((int64_t) llama_n_ctx_seq(ctx) < need) {
            farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                "the KV cache holds %u cells, %s needs %s + n_local + n_ubatch = %d + %d + %u = %lld: "
                "enlarge it (-c / n_ctx) or lower n_local / n_ubatch", llama_n_ctx_seq(ctx), method->info.name,
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
            (int64_t) llama_n_ctx_seq(ctx) < (int64_t) n_swa + llama_n_ubatch(ctx)) {
        farctx_fail(err, err_size, FARCTX_ERR_PARAM,
            "the KV cache holds %u cells, and this model's sliding-window layers need their window + n_ubatch = "
            "%d + %u = %lld (llama.cpp caps their cache at the context size): enlarge it (-c / n_ctx) or lower "
            "n_ubatch", llama_n_ctx_seq(ctx), n_swa, llama_n_ubatch(ctx), (long long) n_swa + llama_n_ubatch(ctx));
        farctx_session_free(s);
        return NULL;
    }

    /* the stream starts empty: whatever its sequence held before is not part of it */
    llama_memory_seq_rm(llama_get_memory(ctx), seq_id, -1, -1);
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
    /* the context may outlive the session: leave it with the stock graph, unless it runs another session's
     * settings (several sequences) */
    const struct llama_attn_extrap_params cur = llama_get_attn_extrap(session->ctx);
    if (cur.user_data == (void *) session || cur.mode == LLAMA_ATTN_EXTRAP_NONE) {
        struct llama_attn_extrap_params none = llama_attn_extrap_default_params();
        llama_set_attn_extrap(session->ctx, &none);
    }
    if (session->ops->free != NULL) {
        session->ops->free(session);
    }
    free(session);
}

static int32_t check_space(struct farctx_session * s, int32_t n_tokens) {
    const int64_t n_ctx = llama_n_ctx_seq(s->ctx);  /* the cells of the sequence's stream */
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

/* the tokens of a feed are in the vocabulary */
static int32_t check_tokens(struct farctx_session * s, const int32_t * tokens, int32_t n_tokens) {
    if (n_tokens < 0 || (n_tokens > 0 && tokens == NULL)) {
        return farctx_session_fail(s, FARCTX_ERR_PARAM, "invalid token array (n_tokens = %d)", n_tokens);
    }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(s->model));
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return farctx_session_fail(s, FARCTX_ERR_PARAM,
                "token %d at index %d is outside the vocabulary (0..%d)", tokens[i], i, n_vocab - 1);
        }
    }
    return FARCTX_OK;
}

/* tokens of the next llama_decode of this stream: at most n_max, within the method's segment */
static int32_t chunk_tokens(const struct farctx_session * s, int32_t n_left, int32_t n_max) {
    int32_t n = n_left < n_max ? n_left : n_max;
    if (s->ops->segment_end != NULL) {  /* one segment of the method per llama_decode */
        const int64_t room = s->ops->segment_end(s, s->n_past) - s->n_past;
        n = room < n ? (int32_t) room : n;
    }
    return n;
}

/* the graph settings of a llama_decode of n tokens at the end of the stream. While every query of the batch sees
 * what vanilla attention shows it, the stock graph runs (one segment, flash attention where enabled): as fast as
 * stock llama.cpp */
static struct llama_attn_extrap_params chunk_params(const struct farctx_session * s, int32_t n) {
    const bool plain = s->n_past + n <= s->ops->plain_below(s);
    struct llama_attn_extrap_params ex = plain ? llama_attn_extrap_default_params() : s->custom;
    if (!plain && s->ops->batch_params != NULL) {
        s->ops->batch_params(s, s->n_past, n, &ex);
    }
    return ex;
}

/* before a llama_decode of n tokens of the stream: evict the keys no query reads again (fixed cache), the method's
 * own step */
static int32_t begin_chunk(struct farctx_session * s, int32_t n) {
    if (fixed_cache(s)) {
        /* keys that no query from here on reads: positions [n_global, first needed), but for the newest key, which
         * the mask leaves out where no query reads it (n_local 1): llama.cpp wants a stream's next position to
         * follow the last one in its cache */
        int64_t first = first_needed(s, s->n_past);
        if (first > s->n_past - 1) {
            first = s->n_past - 1;
        }
        const int32_t head = farctx_params_head(&s->params);
        if (first > head && first > s->evicted_to) {
            /* from the full-attention layers' cache only: sliding-window layers (iSWA) keep their own
             * window, and their cache drops what the window passed by itself */
            llama_memory_seq_rm_base(llama_get_memory(s->ctx), s->seq, head, (llama_pos) first);
            s->evicted_to = first;
        }
    }
    return s->ops->before_decode != NULL ? s->ops->before_decode(s, s->n_past, n) : FARCTX_OK;
}

/* the context runs ex (with its callback) for the next llama_decode */
static int32_t use_params(struct farctx_session * s, const struct llama_attn_extrap_params * ex) {
    const struct llama_attn_extrap_params cur = llama_get_attn_extrap(s->ctx);
    if (llama_attn_extrap_same_graph(ex, &cur) && ex->fill == cur.fill && ex->user_data == cur.user_data) {
        return FARCTX_OK;
    }
    const int32_t rc = llama_set_attn_extrap(s->ctx, ex);
    if (rc != LLAMA_ATTN_EXTRAP_OK) {
        return farctx_session_fail(s, FARCTX_ERR_DECODE, "llama.cpp refused the attention settings "
                                   "at token %lld (code %d)", (long long) s->n_past, rc);
    }
    s->active = *ex;
    return FARCTX_OK;
}

/* after a failed llama_decode: nothing of it stays in the stream; the code and message */
static int32_t chunk_failed(struct farctx_session * s, int32_t ret) {
    llama_memory_seq_rm(llama_get_memory(s->ctx), s->seq, (llama_pos) s->n_past, -1);
    if (s->fill_error) {
        /* the method refused the ubatch (its message is in s->error; llama_decode failed it without
         * computing it) */
        return FARCTX_ERR_PARAM;
    }
    return farctx_session_fail(s, ret == 1 ? FARCTX_ERR_NO_SPACE : FARCTX_ERR_DECODE,
        "llama_decode failed with code %d at token %lld", ret, (long long) s->n_past);
}

/* the sessions of one llama_decode: the callback of each sequence's queries is its session's */
struct farctx_group {
    struct farctx_session ** members;
    int32_t n;
};

static int32_t group_fill(void * user_data, struct llama_attn_extrap_ubatch * ub) {
    const struct farctx_group * g = (const struct farctx_group *) user_data;
    for (int32_t i = 0; i < g->n; ++i) {
        struct farctx_session * m = g->members[i];
        if (m->seq == ub->seq_id) {
            return m->custom.fill(m->custom.user_data, ub);
        }
    }
    return 1;  /* a sequence of no session of the group: llama.cpp fails the ubatch */
}

/* the checks before a feed: one context, distinct sequences, tokens in the vocabulary, room in each cache */
static int32_t check_feed(struct farctx_session ** sessions, int32_t n_sessions, const int32_t * const * tokens,
                          const int32_t * n_tokens, int32_t * bad) {
    struct llama_context * ctx = sessions[0] ? sessions[0]->ctx : NULL;
    for (int32_t i = 0; i < n_sessions; ++i) {
        struct farctx_session * s = sessions[i];
        if (s == NULL) {
            return FARCTX_ERR_PARAM;
        }
        s->error[0] = '\0';
        *bad = i;
        if (s->ctx != ctx) {
            return farctx_session_fail(s, FARCTX_ERR_PARAM, "the sessions fed together must share one llama_context");
        }
        for (int32_t j = 0; j < i; ++j) {
            if (sessions[j]->seq == s->seq) {
                return farctx_session_fail(s, FARCTX_ERR_PARAM, "two sessions of sequence %d fed together", s->seq);
            }
        }
        int32_t rc = check_tokens(s, tokens[i], n_tokens[i]);
        if (rc == FARCTX_OK && n_tokens[i] > 0) {
            rc = check_space(s, n_tokens[i]);
        }
        if (rc != FARCTX_OK) {
            return rc;
        }
    }
    return FARCTX_OK;
}

/*
 * The one feed loop: n_tokens[i] tokens after session i's stream, for every session of one context. Each round
 * decodes one group: the first stream with tokens left and every other whose next chunk has the same length and
 * graph settings (llama.cpp splits a batch of several sequences into equal runs per sequence), at most n_ubatch
 * tokens in all. The one chunking rule: a chunk is at most n_ubatch tokens (a llama_decode is one ubatch, as
 * llama.cpp would split it; a fixed cache evicts between calls), cut where the method's segment ends.
 * logits: NULL; all_logits false: row i = session i's last token; true: every token's row, session by session in
 * token order. progress: (tokens done over all sessions, total) after each llama_decode; false cancels.
 */
static int32_t feed_streams(struct farctx_session ** sessions, int32_t n_sessions,
                            const int32_t * const * tokens, const int32_t * n_tokens,
                            bool all_logits, float * logits,
                            farctx_progress_cb progress, void * progress_data, int32_t * failed) {
    if (failed != NULL) {
        *failed = -1;
    }
    if (n_sessions <= 0 || sessions == NULL || tokens == NULL || n_tokens == NULL) {
        return n_sessions == 0 ? FARCTX_OK : FARCTX_ERR_PARAM;
    }
    int32_t bad = -1;
    int32_t rc = check_feed(sessions, n_sessions, tokens, n_tokens, &bad);
    if (rc != FARCTX_OK) {
        if (failed != NULL) {
            *failed = bad;
        }
        return rc;
    }

    struct llama_context * ctx = sessions[0]->ctx;
    const int32_t n_vocab  = llama_vocab_n_tokens(llama_model_get_vocab(sessions[0]->model));
    const int32_t n_ubatch = (int32_t) llama_n_ubatch(ctx);
    int64_t n_total = 0;
    for (int32_t i = 0; i < n_sessions; ++i) {
        n_total += n_tokens[i];
    }
    if (n_total == 0) {
        return FARCTX_OK;
    }
    int32_t * done   = calloc((size_t) n_sessions, sizeof(int32_t));
    int32_t * chunk  = calloc((size_t) n_sessions, sizeof(int32_t));
    int64_t * row0   = calloc((size_t) n_sessions, sizeof(int64_t));  /* all_logits: session i's first row */
    struct farctx_session ** members = calloc((size_t) n_sessions, sizeof(*members));
    int32_t * member_of = calloc((size_t) n_sessions, sizeof(int32_t));
    struct llama_attn_extrap_params * params = calloc((size_t) n_sessions, sizeof(*params));
    /* sized to this call (one token per stream when decoding): llama_batch_init allocates a sequence-id array
     * per slot */
    struct llama_batch batch = llama_batch_init(n_total < n_ubatch ? (int32_t) n_total : n_ubatch, 0, 1);
    if (done == NULL || chunk == NULL || row0 == NULL || members == NULL || member_of == NULL || params == NULL) {
        rc = farctx_session_fail(sessions[0], FARCTX_ERR_PARAM, "out of memory");
        bad = 0;
        goto out;
    }
    for (int32_t i = 1; i < n_sessions; ++i) {
        row0[i] = row0[i - 1] + n_tokens[i - 1];
    }
    struct llama_attn_extrap_params own = llama_get_attn_extrap(ctx);  /* a session's own settings */
    for (int32_t i = 0; i < n_sessions; ++i) {
        if (n_tokens[i] > 0 && sessions[i]->ops->begin_feed != NULL) {
            sessions[i]->ops->begin_feed(sessions[i], n_tokens[i]);
        }
    }

    int64_t n_done = 0;
    for (;;) {
        int32_t lead = -1;
        for (int32_t i = 0; i < n_sessions; ++i) {
            if (done[i] < n_tokens[i]) {
                chunk[i]  = chunk_tokens(sessions[i], n_tokens[i] - done[i], n_ubatch);
                params[i] = chunk_params(sessions[i], chunk[i]);
                lead = lead < 0 ? i : lead;
            }
        }
        if (lead < 0) {
            break;
        }
        const int32_t n = chunk[lead];
        int32_t n_members = 0;
        for (int32_t i = lead; i < n_sessions && (n_members + 1)*n <= n_ubatch; ++i) {
            if (done[i] < n_tokens[i] && chunk[i] == n && llama_attn_extrap_same_graph(&params[i], &params[lead])) {
                member_of[n_members] = i;
                members[n_members++] = sessions[i];
            }
        }

        batch.n_tokens = 0;
        for (int32_t g = 0; g < n_members && rc == FARCTX_OK; ++g) {
            struct farctx_session * s = members[g];
            const int32_t i = member_of[g];
            for (int32_t t = 0; t < n; ++t) {
                const int32_t b = batch.n_tokens++;
                batch.token[b]     = tokens[i][done[i] + t];
                batch.pos[b]       = (llama_pos) (s->n_past + t);
                batch.n_seq_id[b]  = 1;
                batch.seq_id[b][0] = s->seq;
                batch.logits[b]    = (all_logits && logits != NULL) || done[i] + t == n_tokens[i] - 1;
            }
            rc = begin_chunk(s, n);
            bad = i;
        }
        struct farctx_group group = { members, n_members };
        struct llama_attn_extrap_params ex = params[lead];
        own = params[lead];
        if (n_members > 1 && ex.mode != LLAMA_ATTN_EXTRAP_NONE) {
            ex.fill      = group_fill;
            ex.user_data = &group;
        }
        if (rc == FARCTX_OK) {
            bad = lead;
            rc = use_params(sessions[lead], &ex);
        }
        if (rc != FARCTX_OK) {
            break;
        }

        for (int32_t g = 0; g < n_members; ++g) {
            members[g]->fill_error = false;
            members[g]->active = params[member_of[g]];  /* the graph its callback fills for (kv_first) */
        }
        const int32_t ret = llama_decode(ctx, batch);
        bool fill_error = false;
        for (int32_t g = 0; g < n_members; ++g) {
            members[g]->n_decode++;
            if (members[g]->fill_error) {
                fill_error = true;
                bad = member_of[g];
            }
        }
        if (ret != 0 || fill_error) {
            /* nothing of this decode stays in any of its streams; the one at fault has the message */
            for (int32_t g = 0; g < n_members; ++g) {
                const int32_t code = chunk_failed(members[g], ret);
                if (member_of[g] == bad || (!fill_error && g == 0)) {
                    rc = code;
                    bad = member_of[g];
                }
            }
            break;
        }

        for (int32_t g = 0, b = 0; g < n_members; ++g, b += n) {
            const int32_t i = member_of[g];
            if (logits != NULL && all_logits) {
                for (int32_t t = 0; t < n; ++t) {
                    memcpy(logits + (size_t) (row0[i] + done[i] + t) * n_vocab, llama_get_logits_ith(ctx, b + t),
                           sizeof(float) * (size_t) n_vocab);
                }
            } else if (logits != NULL && done[i] + n == n_tokens[i]) {
                memcpy(logits + (size_t) i * n_vocab, llama_get_logits_ith(ctx, b + n - 1), sizeof(float) * (size_t) n_vocab);
            }
            members[g]->n_past += n;
            done[i] += n;
            n_done  += n;
        }

        if (progress != NULL && !progress(progress_data, n_done, n_total) && n_done < n_total) {
            bad = lead;
            rc = farctx_session_fail(sessions[lead], FARCTX_ERR_CANCELLED, "cancelled after %lld of %lld tokens",
                                     (long long) n_done, (long long) n_total);
            break;
        }
    }

out:
    {
        /* the context must not keep a callback into this call's stack: the last group's lead's own (the same
         * graph, so the next feed does not reserve again) */
        const struct llama_attn_extrap_params cur = llama_get_attn_extrap(ctx);
        if (cur.fill == group_fill) {
            llama_set_attn_extrap(ctx, &own);
        }
    }
    if (rc != FARCTX_OK && failed != NULL) {
        *failed = bad;
    }
    llama_batch_free(batch);
    free(done);
    free(chunk);
    free(row0);
    free(members);
    free(member_of);
    free(params);
    return rc;
}

int32_t farctx_session_feed(struct farctx_session * s, const int32_t * tokens, int32_t n_tokens,
                            bool all_logits, float * logits,
                            farctx_progress_cb progress, void * progress_data) {
    if (s == NULL) {
        return FARCTX_ERR_PARAM;
    }
    const int32_t * const streams[1] = { tokens };
    return feed_streams(&s, 1, streams, &n_tokens, all_logits, logits, progress, progress_data, NULL);
}

int32_t farctx_sessions_feed(struct farctx_session ** sessions, int32_t n_sessions,
                             const int32_t * const * tokens, const int32_t * n_tokens,
                             float * logits, int32_t * failed) {
    return feed_streams(sessions, n_sessions, tokens, n_tokens, false, logits, NULL, NULL, failed);
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
    stats->n_local       = fixed_cache(s) ? s->params.n_local : 0;
    stats->window_fitted = s->window_fitted;
    if (s->ops->stats != NULL) {
        s->ops->stats(s, stats);
    }
}

struct farctx_params farctx_session_params(const struct farctx_session * s) {
    return s ? s->params : farctx_default_params();
}

/* -- the stream's state (farctx.h: farctx_session_state_*) ----------------------------------------------------- */

#define FARCTX_STATE_MAGIC 0x31535846u  /* "FXS1" */

struct state_header {
    uint32_t magic;
    int32_t  method;
    int32_t  params[FARCTX_PARAM_COUNT];  /* the parameters in force */
    int64_t  n_past;
    int64_t  evicted_to;
    int32_t  n_decode;
    int32_t  window_fitted;
    uint64_t method_bytes;
};

static struct state_header state_header_of(const struct farctx_session * s) {
    struct state_header h;
    memset(&h, 0, sizeof(h));
    h.magic  = FARCTX_STATE_MAGIC;
    h.method = s->params.method;
    for (int32_t i = 0; i < FARCTX_PARAM_COUNT; ++i) {
        h.params[i] = farctx_param_get(&s->params, i);
    }
    h.n_past        = s->n_past;
    h.evicted_to    = s->evicted_to;
    h.n_decode      = s->n_decode;
    h.window_fitted = s->window_fitted;
    h.method_bytes  = s->ops->state_write != NULL ? s->ops->state_write(s, NULL) : 0;
    return h;
}

size_t farctx_session_state_size(const struct farctx_session * s) {
    return s == NULL ? 0 : sizeof(struct state_header) + state_header_of(s).method_bytes;
}

size_t farctx_session_state_get(const struct farctx_session * s, uint8_t * dst, size_t size) {
    if (s == NULL || dst == NULL) {
        return 0;
    }
    const struct state_header h = state_header_of(s);
    if (size < sizeof(h) + h.method_bytes) {
        return 0;
    }
    memcpy(dst, &h, sizeof(h));
    if (h.method_bytes > 0) {
        s->ops->state_write(s, dst + sizeof(h));
    }
    return sizeof(h) + h.method_bytes;
}

int32_t farctx_session_state_set(struct farctx_session * s, const uint8_t * src, size_t size) {
    if (s == NULL) {
        return FARCTX_ERR_PARAM;
    }
    struct state_header h;
    if (src == NULL || size < sizeof(h)) {
        return farctx_session_fail(s, FARCTX_ERR_PARAM, "not a farctx stream state (%zu bytes)", size);
    }
    memcpy(&h, src, sizeof(h));
    if (h.magic != FARCTX_STATE_MAGIC || size != sizeof(h) + h.method_bytes) {
        return farctx_session_fail(s, FARCTX_ERR_PARAM, "not a farctx stream state (%zu bytes)", size);
    }
    const struct state_header mine = state_header_of(s);
    if (h.method != mine.method) {
        return farctx_session_fail(s, FARCTX_ERR_PARAM, "the state was saved under %s, this stream runs %s",
                                   farctx_method_name(h.method), farctx_method_name(mine.method));
    }
    for (int32_t i = 0; i < FARCTX_PARAM_COUNT; ++i) {
        if (h.params[i] != mine.params[i]) {
            return farctx_session_fail(s, FARCTX_ERR_PARAM, "the state was saved with %s %d, this stream has %d",
                                       farctx_param_get_info(i).name, h.params[i], mine.params[i]);
        }
    }
    if (h.method_bytes > 0) {
        if (s->ops->state_read == NULL) {
            return farctx_session_fail(s, FARCTX_ERR_PARAM, "not a farctx stream state of %s",
                                       farctx_method_name(h.method));
        }
        const int32_t rc = s->ops->state_read(s, src + sizeof(h), (size_t) h.method_bytes);
        if (rc != FARCTX_OK) {
            return rc;
        }
    }
    s->n_past        = h.n_past;
    s->evicted_to    = h.evicted_to;
    s->n_decode      = h.n_decode;
    s->window_fitted = h.window_fitted != 0;
    return FARCTX_OK;
}

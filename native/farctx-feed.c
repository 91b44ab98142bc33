/* farctx: feeding streams: each llama_decode within one segment of the method, several streams in one batch */
#include "farctx-impl.h"

#include <stdlib.h>
#include <string.h>

static int32_t check_space(struct farctx_session * s, int32_t n_tokens) {
    const int64_t n_ctx = llama_n_ctx_seq(s->ctx);  /* the cells of the sequence's stream */
    const int64_t need  = s->n_past + n_tokens;
    if (need > INT32_MAX) {
        return farctx_session_fail(s, FARCTX_ERR_NO_SPACE,
            "the stream would pass %lld tokens: llama.cpp positions are 32-bit (at most %d)",
            (long long) need, INT32_MAX);
    }
    if (farctx_session_fixed_cache(s)) {
        return FARCTX_OK;  /* evicts as it goes */
    }
    if (need > n_ctx) {
        return farctx_session_fail(s, FARCTX_ERR_NO_SPACE,
            "the stream needs %lld cells (%lld already in the cache + %d new tokens) but the KV cache "
            "holds %lld: enlarge the cache (-c / n_ctx), or use --method lminf, which streams through a fixed-size "
            "cache without bound",
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
        const int64_t room = s->ops->segment_end(s, s->n_past, n_left) - s->n_past;
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
    if (farctx_session_fixed_cache(s)) {
        /* keys that no query from here on reads: positions [n_global, first needed), but for the newest key, which
         * the mask leaves out where no query reads it (n_local 1): llama.cpp wants a stream's next position to
         * follow the last one in its cache */
        int64_t first = farctx_session_first_needed(s, s->n_past);
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
        for (int32_t g = 0; g < n_members; ++g) {
            if (members[g]->ops->end_decode != NULL) {
                members[g]->ops->end_decode(members[g], ret == 0 && !fill_error);
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

/* farctx: the context plan (farctx.h: farctx_context_plan): the one decider of a stream's cells, the batch sizes in
 * force and the window; every surface asks it, and farctx_session_init holds its context to it */
#include "farctx-impl.h"

#include <stdio.h>
#include <string.h>

/* llama.cpp's cells of n_ctx for n_seq streams: n_ctx rounded up to 256, split per stream and rounded up again */
static int64_t pad256(int64_t n) {
    return (n + 255) / 256 * 256;
}

static int64_t cells_per_stream(int64_t n_ctx, int32_t n_seq) {
    return n_seq > 1 ? pad256(pad256(n_ctx) / n_seq) : pad256(n_ctx);
}

/* KV cells a stream needs: a fixed-cache method head + n_local + n_ubatch whatever its length; the others
 * n_prompt + n_predict, or n_ctx_train when both are 0 (stock's context) */
static int64_t stream_cells(const struct farctx_params * p, int64_t n_ubatch, int64_t n_prompt, int64_t n_predict) {
    if (farctx_method_fixed_cache(p->method)) {
        return (int64_t) farctx_params_head(p) + p->n_local + n_ubatch;
    }
    const int64_t stream = (n_prompt > 0 ? n_prompt : 0) + (n_predict > 0 ? n_predict : 0);
    return stream > 0 ? stream : p->n_ctx_train;
}

struct farctx_plan_params farctx_plan_default_params(void) {
    struct farctx_plan_params p;
    memset(&p, 0, sizeof(p));
    p.n_seq = 1;
    return p;
}

/* a fixed cache of `cells` per stream with the caller's n_ubatch unset: the room head + n_local leave, at most the
 * default ubatch. With n_local unset (the cache as a memory budget) the default ubatch if the default window fits
 * beside it, else a quarter of the cache, so that most of it holds the window; either way at most what a
 * sliding window leaves */
static int64_t fitted_ubatch(const struct farctx_params * p, bool local_set, int64_t cells, int32_t n_swa,
                             int64_t full) {
    int64_t room = cells - stream_cells(p, 0, 0, 0);
    if (!local_set && room < full) {
        room = cells / 4 > 1 ? cells / 4 : 1;
    }
    if (n_swa > 0 && cells - n_swa < room) {
        room = cells - n_swa;
    }
    return room > 0 && room < full ? room : full;
}

int32_t farctx_context_plan(const struct farctx_params * method, const struct farctx_plan_params * in,
                            struct farctx_plan * out, char * err, size_t err_size) {
    if (method == NULL || in == NULL || out == NULL || farctx_method_def(method->method) == NULL) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "no method or plan parameters");
    }
    const struct farctx_method_def * d = farctx_method_def(method->method);
    struct farctx_params p = *method;
    if (p.n_ctx_train <= 0) {
        p.n_ctx_train = in->n_ctx_train;
    }
    if (p.n_ctx_train <= 0) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                           "the model does not declare its trained context length: set n_ctx_train");
    }
    const bool local_set = p.n_local > 0;
    farctx_params_resolve(&p, NULL);
    const int32_t n_seq = in->n_seq > 1 ? in->n_seq : 1;
    const int32_t n_swa = in->n_swa > 0 ? in->n_swa : 0;

    memset(out, 0, sizeof(*out));
    int64_t n_batch  = in->n_batch  > 0 ? in->n_batch  : FARCTX_N_BATCH_DEFAULT;
    int64_t n_ubatch = in->n_ubatch > 0 ? in->n_ubatch : FARCTX_N_UBATCH_DEFAULT;

    int64_t cells;  /* per stream */
    if (!d->info.fixed_cache) {
        /* the caller's cache; else the stream's need (stream_cells: its length, or n_ctx_train, as stock's
         * for the methods stock inside the trained context), which a stream of unknown length under another
         * extrapolating method may pass: room for FARCTX_WHOLE_STREAM_DEFAULT x */
        const bool known = in->n_prompt > 0 || in->n_predict > 0 || d->info.stock_inside;
        cells = in->n_ctx > 0 ? cells_per_stream(in->n_ctx, n_seq)
              : known         ? stream_cells(&p, n_ubatch, in->n_prompt, in->n_predict)
              : (int64_t) FARCTX_WHOLE_STREAM_DEFAULT * p.n_ctx_train;
    } else if (in->n_ctx <= 0) {
        /* the method's own cache: head + n_local + n_ubatch, and on sliding-window layers their window + a ubatch */
        n_ubatch = n_ubatch < n_batch ? n_ubatch : n_batch;
        cells = stream_cells(&p, n_ubatch, 0, 0);
        if (n_swa > 0 && cells < n_swa + n_ubatch) {
            cells = n_swa + n_ubatch;
        }
    } else {
        /* the caller's cache, a memory budget: llama.cpp's clamps of the batches to it, the ubatch fitted when the
         * caller set none, then the window when n_local is unset */
        cells = cells_per_stream(in->n_ctx, n_seq);
        const int64_t total = pad256(in->n_ctx);
        n_batch  = n_batch < total ? n_batch : total;
        n_ubatch = n_ubatch < n_batch ? n_ubatch : n_batch;
        if (in->n_ubatch <= 0) {
            n_ubatch = fitted_ubatch(&p, local_set, cells, n_swa, n_ubatch);
        }
        const int64_t room = cells - farctx_params_head(&p) - n_ubatch;
        if (!local_set && room < p.n_local && room >= FARCTX_FIT_LOCAL_MIN) {
            p.n_local = (int32_t) room;
            out->window_fitted = true;
            if (d->ops->validate != NULL && d->ops->validate(&p, err, err_size) != FARCTX_OK) {
                return FARCTX_ERR_PARAM;
            }
        }
    }
    n_ubatch = n_ubatch < n_batch ? n_ubatch : n_batch;

    if (d->info.fixed_cache) {
        const int32_t head = farctx_params_head(&p);
        const char * head_name = d->info.head_param >= 0 ? farctx_param_get_info(d->info.head_param).name : "0";
        const int64_t need = stream_cells(&p, n_ubatch, 0, 0);
        char per[96] = "";
        if (n_seq > 1) {
            snprintf(per, sizeof(per), " per stream (%d cells / %d streams)", in->n_ctx, n_seq);
        }
        if (cells < need) {
            /* an unset n_local would have been fitted down to FARCTX_FIT_LOCAL_MIN: that is the least it needs */
            const bool fits = !local_set && p.n_local > FARCTX_FIT_LOCAL_MIN;
            const int32_t least = fits ? FARCTX_FIT_LOCAL_MIN : p.n_local;
            char window[96] = "";
            if (fits) {
                snprintf(window, sizeof(window), " (the smallest window fitted to a cache; the default is %d)",
                         p.n_local);
            }
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                "%s needs %lld KV cells%s: %s + n_local + n_ubatch = %d + %d%s + %lld; the KV cache holds %lld: "
                "enlarge it (-c / n_ctx) or lower n_local / n_ubatch", d->info.name,
                (long long) head + least + n_ubatch, per, head_name, head, least, window, (long long) n_ubatch,
                (long long) cells);
        }
        if (n_swa > 0 && cells < (int64_t) n_swa + n_ubatch) {
            return farctx_fail(err, err_size, FARCTX_ERR_PARAM,
                "the KV cache holds %lld cells%s, and this model's sliding-window layers need their window + n_ubatch "
                "= %d + %lld = %lld (llama.cpp caps their cache at the context size): enlarge it (-c / n_ctx) or "
                "lower n_ubatch", (long long) cells, per, n_swa, (long long) n_ubatch, (long long) n_swa + n_ubatch);
        }
        out->n_local = p.n_local;
    }
    if (!d->info.fixed_cache && in->n_ctx > 0 && in->n_prompt > 0) {
        /* a stream that keeps every token: its prompt and what it asks to generate (at least one) in its cells */
        const int64_t n_gen = in->n_predict > 0 ? in->n_predict : 1;
        if (in->n_prompt + n_gen > cells) {
            return farctx_fail(err, err_size, FARCTX_ERR_NO_SPACE,
                "%lld prompt tokens + %lld to generate need %lld KV cells, more than the %lld of a stream: raise -c / "
                "n_ctx%s%s", (long long) in->n_prompt, (long long) n_gen, (long long) (in->n_prompt + n_gen),
                (long long) cells, n_seq > 1 ? " (shared by the streams)" : "",
                d->info.stock_graph ? "" : ", or use method lminf, which streams through a fixed-size cache without "
                                           "bound");
        }
    }
    if (cells > INT32_MAX / n_seq) {
        return farctx_fail(err, err_size, FARCTX_ERR_PARAM, "%lld cells x %d streams exceed llama.cpp's 32-bit sizes",
                           (long long) cells, n_seq);
    }
    out->n_ctx     = (int32_t) (in->n_ctx > 0 ? in->n_ctx : cells * n_seq);
    out->n_ctx_seq = (int32_t) cells_per_stream(out->n_ctx, n_seq);  /* what llama.cpp makes of n_ctx */
    out->n_batch   = (int32_t) n_batch;
    out->n_ubatch  = (int32_t) n_ubatch;
    out->n_predict_max = d->info.fixed_cache ? -1 : out->n_ctx_seq - (in->n_prompt > 0 ? in->n_prompt : 0);
    return farctx_fail(err, err_size, FARCTX_OK, "%s", "");
}

/*
 * farctx: run GGUF language models past their trained context inside llama.cpp.
 *
 * One public header, llama.h's conventions: a params struct with a defaults function,
 * an opaque session with init/free, return codes plus a readable message. No global state.
 *
 * This header is also the cffi cdef source of the Python package: keep every declaration
 * on lines that do not start with '#', and use only the FARCTX_API macro below.
 */
#ifndef FARCTX_H
#define FARCTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FARCTX_API __declspec(dllexport)
#else
#define FARCTX_API __attribute__((visibility("default")))
#endif

struct llama_context;
struct llama_model;

/* attention methods (DESIGN.md section 1) */
enum farctx_method {
    FARCTX_METHOD_VANILLA     = 0,
    FARCTX_METHOD_LMINF       = 1,
    FARCTX_METHOD_WINDOW      = 2,
    FARCTX_METHOD_LAMBDA_ONLY = 3,
    FARCTX_METHOD_REROPE      = 4,
    FARCTX_METHOD_STREAMING   = 5,
    FARCTX_METHOD_MESA        = 6,
    FARCTX_METHOD_SELFEXTEND  = 7,
    FARCTX_METHOD_COUNT       = 8
};

/* return codes */
enum farctx_status {
    FARCTX_OK              =  0,
    FARCTX_ERR_PARAM       = -1, /* invalid parameter                                    */
    FARCTX_ERR_UNSUPPORTED = -2, /* method not available for this model or in this build */
    FARCTX_ERR_NO_SPACE    = -3, /* the tokens do not fit in the KV cache                */
    FARCTX_ERR_DECODE      = -4, /* llama_decode failed                                  */
    FARCTX_ERR_CANCELLED   = -5, /* the progress callback asked to stop                  */
    FARCTX_ERR_REPLAY      = -6  /* cannot rewind there: feed the stream again from token 0 */
};

/* 0 or negative: taken from the model or the method's default (see farctx_default_params) */
struct farctx_params {
    int32_t method;            /* enum farctx_method                                     */
    int32_t n_ctx_train;       /* trained context L_tr; 0 = the model's                  */
    int32_t n_global;          /* LM-Infinite global tokens G (default 10)               */
    int32_t n_local;           /* local window L (lminf, window, lambda-only, rerope: 0 = L_tr;
                                  streaming: the window R including the query, 0 = L_tr - n_sink) */
    int32_t n_sink;            /* StreamingLLM sinks S (default 4)                       */
    int32_t first_chunk;       /* Mesa first chunk F (default 100)                       */
    int32_t stair_width;       /* Mesa stair width E (default 50)                        */
    int32_t last_context;      /* Mesa last context (default 512)                        */
    int32_t gen_budget;        /* Mesa reserved generation budget (default 50)           */
    int32_t group;             /* SelfExtend group Gs; 0 = ceil((n_ctx - W) / (L_tr - W)) */
    int32_t neighbor;          /* SelfExtend neighbour window W; 0 = L_tr / 2            */
};

FARCTX_API struct farctx_params farctx_default_params(void);

/* "vanilla", "lminf", ...; NULL for an unknown value */
FARCTX_API const char * farctx_method_name(int32_t method);
/* enum farctx_method, or -1 for an unknown name */
FARCTX_API int32_t farctx_method_from_name(const char * name);
/* whether this build implements the method at all */
FARCTX_API bool farctx_method_available(int32_t method);
/* whether the method streams through a fixed-size cache (evicting what no query reads again):
 * its streams are not limited by the cache size */
FARCTX_API bool farctx_method_fixed_cache(int32_t method);

/*
 * Check params against a model (NULL: the parameters alone). Returns FARCTX_OK or an error
 * code, with a one-line message in err (err_size bytes, may be NULL).
 */
FARCTX_API int32_t farctx_params_validate(
        const struct farctx_params * params,
        const struct llama_model   * model,
        char * err, size_t err_size);

/*
 * Mesa-Extrapolation's split of an n-token prompt (the authors' rule): returns whether it is
 * chunked; chunk = the middle-chunk width C, n_middle = the number N of middle chunks.
 */
FARCTX_API bool farctx_mesa_schedule(const struct farctx_params * params, int64_t n, int64_t * chunk, int64_t * n_middle);

/*
 * KV cells a fixed-size-cache method needs (head tokens + n_local + n_ubatch) for a model trained
 * on n_ctx_train tokens (used when params->n_ctx_train is 0); 0 for the other methods.
 */
FARCTX_API int64_t farctx_params_cache_cells(const struct farctx_params * params, int32_t n_ctx_train, int32_t n_ubatch);

/* progress of a long feed: return false to cancel (the tokens fed so far stay in the cache) */
typedef bool (*farctx_progress_cb)(void * user_data, int64_t n_done, int64_t n_total);

/* a token stream through one sequence (seq 0) of a llama_context, under one method */
struct farctx_session;

/* NULL on error, with the message in err */
FARCTX_API struct farctx_session * farctx_session_init(
        struct llama_context * ctx,
        const struct farctx_params * params,
        char * err, size_t err_size);

FARCTX_API void farctx_session_free(struct farctx_session * session);

/*
 * Feed tokens after the ones already in the stream, in batches of the context's n_batch.
 * logits: NULL, or room for n_vocab floats (all_logits false: the last token's) or
 * n_tokens*n_vocab floats (all_logits true: every token's, in order). The context keeps the last
 * token's logits either way (llama_get_logits_ith(ctx, -1), what a sampler reads), as llama.cpp does
 * for any batch; with all_logits, every token of the last batch.
 */
FARCTX_API int32_t farctx_session_feed(
        struct farctx_session * session,
        const int32_t * tokens, int32_t n_tokens,
        bool all_logits, float * logits,
        farctx_progress_cb progress, void * progress_data);

/* forget the stream from token n_keep on (0 <= n_keep <= n_past) */
FARCTX_API int32_t farctx_session_rewind(struct farctx_session * session, int64_t n_keep);

/* the message of the last error of this session ("" if none) */
FARCTX_API const char * farctx_session_error(const struct farctx_session * session);

struct farctx_stats {
    int64_t n_past;            /* tokens in the stream so far                            */
    int32_t n_ctx;             /* cells in the KV cache                                  */
    int32_t n_cells_used;      /* cells holding a token                                  */
    int32_t n_ctx_train;       /* trained context in force                               */
    int32_t n_decode;          /* llama_decode calls so far                              */
    int64_t kv_bytes;          /* size of the KV cache buffers                           */
    int32_t n_stair_moves;     /* mesa: times the stair boundary moved during generation */
    int32_t n_cache_rotations; /* mesa: times the cached keys were rotated in place (to
                                  the stair in the last chunk or the first generated token,
                                  at each stair move, back after a rewind) */
};

FARCTX_API void farctx_session_stats(const struct farctx_session * session, struct farctx_stats * stats);

/* the parameters in force (defaults resolved against the model) */
FARCTX_API struct farctx_params farctx_session_params(const struct farctx_session * session);

#ifdef __cplusplus
}
#endif

#endif /* FARCTX_H */

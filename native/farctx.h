/*
 * farctx: run GGUF language models past their trained context inside llama.cpp (docs/c-api.md).
 *
 * llama.h's conventions: params structs with defaults functions, an opaque session with init/free, return codes
 * with a one-line message. No global state. Also the cffi cdef of the Python package: no declaration on a line
 * that starts with '#', and no macro but FARCTX_API.
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

/* attention methods (docs/methods.md) */
enum farctx_method {
    FARCTX_METHOD_VANILLA     = 0,
    FARCTX_METHOD_LMINF       = 1,
    FARCTX_METHOD_WINDOW      = 2,
    FARCTX_METHOD_LAMBDA_ONLY = 3,
    FARCTX_METHOD_REROPE      = 4,
    FARCTX_METHOD_STREAMING   = 5,
    FARCTX_METHOD_MESA        = 6,
    FARCTX_METHOD_SELFEXTEND  = 7,
    FARCTX_METHOD_DCA         = 8,
    FARCTX_METHOD_STRING      = 9,
    FARCTX_METHOD_AUTO        = 10,
    FARCTX_METHOD_COUNT       = 11
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

/* a method and its parameters (meaning, default, minimum: farctx_param_get_info); 0: from the model or the method */
struct farctx_params {
    int32_t method;            /* enum farctx_method */
    int32_t n_ctx_train;
    int32_t n_global;
    int32_t n_local;
    int32_t n_sink;
    int32_t first_chunk;
    int32_t stair_width;
    int32_t last_context;
    int32_t gen_budget;
    int32_t group;
    int32_t neighbor;
    int32_t chunk_size;
    int32_t local_window;
    int32_t shifted_offset;
    int32_t local_value;
};

FARCTX_API struct farctx_params farctx_default_params(void);

/* the method table: every fact about a method, read by every surface (docs/c-api.md) */

/* kinds of model, as bits of farctx_method_info.model_kinds (farctx_model_kind tells a model's) */
enum farctx_model_kind {
    FARCTX_MODEL_ROPE      = 1,  /* causal full attention with RoPE over one unified KV cache       */
    FARCTX_MODEL_SWA       = 2,  /* sliding-window attention layers                                */
    FARCTX_MODEL_RECURRENT = 4,  /* recurrent or hybrid (attention + recurrent) layers             */
    FARCTX_MODEL_OTHER     = 8,  /* MLA, M-RoPE, no RoPE, non-causal attention                     */
    FARCTX_MODEL_ANY       = 15
};

struct farctx_method_info {
    const char * name;         /* "lminf"; NULL for an unknown method                              */
    const char * help;         /* one line                                                         */
    bool     fixed_cache;      /* a fixed-size cache (head + n_local + n_ubatch cells); else every token stays */
    bool     stock_graph;      /* llama.cpp's own graph (the baseline: no extrapolation)           */
    int32_t  head_param;       /* parameter index of the head tokens never evicted (n_global, n_sink); -1: none */
    uint32_t model_kinds;      /* enum farctx_model_kind bits: the models it can run on            */
    bool     whole_prompt;     /* plans a prompt from the one feed that brings it (mesa's chunks)   */
    bool     stock_inside;     /* llama.cpp's own graph inside the trained context, a cache sized as stock's */
};

FARCTX_API int32_t farctx_method_count(void);
FARCTX_API struct farctx_method_info farctx_method_get_info(int32_t method);

/* the int32_t fields of struct farctx_params after `method`, by index 0 .. farctx_param_count() - 1 */
struct farctx_param_info {
    const char * name;         /* the field; also the keyword argument, request field, CLI --name-with-dashes */
    const char * help;         /* one line (what 0 means where it is "auto")                       */
    int32_t  default_value;    /* what farctx_default_params() sets                                */
    int32_t  min_value;        /* smallest valid value                                             */
    uint32_t methods;          /* bit (1 << method) set: the method reads it                       */
    size_t   offset;           /* offsetof(struct farctx_params, name)                             */
};

FARCTX_API int32_t farctx_param_count(void);
/* name NULL for an index out of range */
FARCTX_API struct farctx_param_info farctx_param_get_info(int32_t i);
FARCTX_API int32_t farctx_param_get(const struct farctx_params * params, int32_t i);
/* false for an index out of range */
FARCTX_API bool farctx_param_set(struct farctx_params * params, int32_t i, int32_t value);

/* "vanilla", "lminf", ...; NULL for an unknown value */
FARCTX_API const char * farctx_method_name(int32_t method);
/* enum farctx_method, or -1 for an unknown name */
FARCTX_API int32_t farctx_method_from_name(const char * name);
/* whether this build implements the method at all */
FARCTX_API bool farctx_method_available(int32_t method);
/* farctx_method_get_info(method).fixed_cache */
FARCTX_API bool farctx_method_fixed_cache(int32_t method);

/* a model's kind (one enum farctx_model_kind bit); why: a short phrase unless FARCTX_MODEL_ROPE ("" then) */
FARCTX_API int32_t farctx_model_kind(const struct llama_model * model, char * why, size_t why_size);

/* FARCTX_OK if the method runs on this model in this build, else FARCTX_ERR_UNSUPPORTED / _PARAM with the reason */
FARCTX_API int32_t farctx_method_supported(int32_t method, const struct llama_model * model,
                                           char * err, size_t err_size);
/* the method that runs when the caller asks for `method` (auto: vanilla where only vanilla runs; why: the reason) */
FARCTX_API int32_t farctx_method_for_model(int32_t method, const struct llama_model * model,
                                           char * why, size_t why_size);

/* the least window fitted to a cache smaller than a fixed-cache method's default (n_local unset; docs/c-api.md) */
enum { FARCTX_FIT_LOCAL_MIN = 64 };

/* a plan's batches when unset (llama-cpp-python's); a whole-stream cache of unknown length: this x n_ctx_train */
enum { FARCTX_N_BATCH_DEFAULT = 512, FARCTX_N_UBATCH_DEFAULT = 512, FARCTX_WHOLE_STREAM_DEFAULT = 4 };

/* what a context plan is asked for: the model's facts and the caller's sizes (0: unset) */
struct farctx_plan_params {
    int32_t n_ctx_train;   /* the model's trained context (params->n_ctx_train, if set, wins)             */
    int32_t n_swa;         /* the model's sliding window; 0: no sliding-window layers                     */
    int32_t n_ctx;         /* cells of all streams together (llama.cpp's -c); 0: what the method needs    */
    int32_t n_batch;       /* 0: FARCTX_N_BATCH_DEFAULT                                                   */
    int32_t n_ubatch;      /* 0: the default, or what a fixed cache of the caller's size leaves room for  */
    int32_t n_seq;         /* streams, one KV stream each                                                 */
    int64_t n_prompt;      /* the stream's prompt when known: sizes an unset cache, is checked against a set one */
    int64_t n_predict;     /* the tokens it asks to generate; 0: unknown (at least one)                       */
};

/* what a context under a method holds */
struct farctx_plan {
    int32_t n_ctx;         /* cells to make the context with (all streams: llama_context_params.n_ctx)    */
    int32_t n_ctx_seq;     /* cells per stream, as llama.cpp makes them of n_ctx (rounded up to 256)      */
    int32_t n_batch;       /* in force: at most the cells (llama.cpp's clamp)                             */
    int32_t n_ubatch;      /* in force: at most n_batch, fitted to a fixed cache when unset              */
    int32_t n_local;       /* fixed-cache methods: the window in force; 0 for the others                  */
    bool    window_fitted; /* n_local was unset and is the room the cache leaves                          */
    int64_t n_predict_max; /* the most tokens the stream may generate after n_prompt: -1 without bound (a fixed
                              cache), else the cells per stream less n_prompt                                 */
};

FARCTX_API struct farctx_plan_params farctx_plan_default_params(void);

/*
 * The one decider of a context's cells, batch sizes, window and generation room (rules: docs/c-api.md). Returns
 * FARCTX_OK; FARCTX_ERR_PARAM when the cache cannot hold the method; FARCTX_ERR_NO_SPACE when n_prompt + n_predict
 * (at least one) do not fit a stream that keeps every token. err: every size.
 */
FARCTX_API int32_t farctx_context_plan(
        const struct farctx_params      * params,
        const struct farctx_plan_params * in,
        struct farctx_plan              * out,
        char * err, size_t err_size);

/* check params against a model (NULL: the parameters alone); err (may be NULL): the reason */
FARCTX_API int32_t farctx_params_validate(
        const struct farctx_params * params,
        const struct llama_model   * model,
        char * err, size_t err_size);

/* Mesa's split of an n-token prompt: whether it is chunked; chunk: the middle chunks' width; n_middle: their count */
FARCTX_API bool farctx_mesa_schedule(const struct farctx_params * params, int64_t n, int64_t * chunk, int64_t * n_middle);

/* progress of a long feed: return false to cancel (the tokens fed so far stay in the cache) */
typedef bool (*farctx_progress_cb)(void * user_data, int64_t n_done, int64_t n_total);

/* a token stream through one sequence of a llama_context, under one method */
struct farctx_session;

/* NULL on error, with the message in err */
FARCTX_API struct farctx_session * farctx_session_init(
        struct llama_context * ctx,
        const struct farctx_params * params,
        char * err, size_t err_size);

/* a stream through sequence seq_id of a context of several (kv_unified false); farctx_session_init: seq_id 0 */
FARCTX_API struct farctx_session * farctx_session_init_seq(
        struct llama_context * ctx,
        const struct farctx_params * params,
        int32_t seq_id,
        char * err, size_t err_size);

FARCTX_API void farctx_session_free(struct farctx_session * session);

/*
 * Feed tokens after the stream's. logits: NULL, or n_vocab floats (the last token's) or, with all_logits,
 * n_tokens * n_vocab. progress (may be NULL): after each llama_decode; false cancels (FARCTX_ERR_CANCELLED, the
 * tokens decoded stay). Chunking and what the context keeps: docs/c-api.md.
 */
FARCTX_API int32_t farctx_session_feed(
        struct farctx_session * session,
        const int32_t * tokens, int32_t n_tokens,
        bool all_logits, float * logits,
        farctx_progress_cb progress, void * progress_data);

/*
 * Feed several sessions of one context together (n_tokens[i] tokens after session i's; 0: none). logits: NULL, or
 * n_sessions * n_vocab floats, row i session i's last. On an error *failed (may be NULL) is the session at fault;
 * no session keeps the failing llama_decode's tokens. Which chunks share a llama_decode: docs/c-api.md.
 */
FARCTX_API int32_t farctx_sessions_feed(
        struct farctx_session ** sessions, int32_t n_sessions,
        const int32_t * const * tokens, const int32_t * n_tokens,
        float * logits, int32_t * failed);

/* forget the stream from token n_keep on (0 <= n_keep <= n_past) */
FARCTX_API int32_t farctx_session_rewind(struct farctx_session * session, int64_t n_keep);

/* the message of the last error of this session ("" if none) */
FARCTX_API const char * farctx_session_error(const struct farctx_session * session);

struct farctx_stats {
    int64_t n_past;            /* tokens in the stream so far                            */
    int32_t n_ctx;             /* cells in the KV cache (the stream's sequence's)        */
    int32_t n_cells_used;      /* cells holding a token of the stream                    */
    int32_t n_ctx_train;       /* trained context in force                               */
    int32_t n_decode;          /* llama_decode calls so far                              */
    int64_t kv_bytes;          /* size of the KV cache buffers (every sequence's)        */
    int32_t n_stair_moves;     /* mesa: times the stair boundary moved during generation */
    int32_t n_cache_rotations; /* mesa, dca: times the cached keys were rotated in place      */
    int32_t n_local;           /* fixed-cache methods: the window in force (0 for the others) */
    bool    window_fitted;     /* n_local was unset: the window is the room the cache leaves     */
    int64_t n_prompt_planned;  /* mesa: the prompt its chunks are planned for; 0 before a feed   */
};

FARCTX_API void farctx_session_stats(const struct farctx_session * session, struct farctx_stats * stats);

/* the parameters in force (defaults resolved against the model) */
FARCTX_API struct farctx_params farctx_session_params(const struct farctx_session * session);

/* the stream's own state, beside llama.cpp's KV state (saving and loading both restores it: docs/c-api.md) */
/* the bytes a save takes */
FARCTX_API size_t  farctx_session_state_size(const struct farctx_session * session);
/* the bytes written into dst; 0 if size is too small */
FARCTX_API size_t  farctx_session_state_get(const struct farctx_session * session, uint8_t * dst, size_t size);
/* load a state of the same method and parameters (FARCTX_ERR_PARAM otherwise, the session unchanged) */
FARCTX_API int32_t farctx_session_state_set(struct farctx_session * session, const uint8_t * src, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FARCTX_H */

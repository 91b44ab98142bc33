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

/*
 * A method and its parameters. Each parameter's meaning, default, minimum and the methods that read
 * it are in the parameter table (farctx_param_get_info); 0 means "from the model or the method".
 */
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

/*
 * The method table: every fact about a method lives in libfarctx and is read from here (the Python
 * parameters, the CLI options, the server's request fields, cache sizing and `farctx info`).
 */

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
    bool     fixed_cache;      /* streams through a fixed-size cache (head + n_local + n_ubatch cells),
                                  evicting what no query reads again; otherwise the whole stream stays */
    bool     stock_graph;      /* llama.cpp's own graph (the baseline: no extrapolation)           */
    int32_t  head_param;       /* parameter index of the head tokens never evicted (n_global, n_sink); -1: none */
    uint32_t model_kinds;      /* enum farctx_model_kind bits: the models it can run on            */
    bool     whole_prompt;     /* plans its prompt from the feed that brings it (mesa's chunks): a prompt
                                  read in several feeds, or after other tokens, is read differently     */
    bool     stock_inside;     /* llama.cpp's own graph for every query inside the trained context, and
                                  a cache sized as stock's (vanilla, auto)                             */
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

/*
 * The kind of a model (one enum farctx_model_kind bit) from llama.h's accessors; a model loaded
 * memory-mapped on the CPU is enough (vocab_only skips the hyperparameters). why: a short phrase for anything but FARCTX_MODEL_ROPE
 * ("sliding-window layers"), "" otherwise.
 */
FARCTX_API int32_t farctx_model_kind(const struct llama_model * model, char * why, size_t why_size);

/*
 * Whether the method can run on this model in this build: FARCTX_OK, or FARCTX_ERR_UNSUPPORTED /
 * FARCTX_ERR_PARAM with the reason in err (a short phrase: "sliding-window layers"). The check
 * farctx_session_init makes before it sets anything up.
 */
FARCTX_API int32_t farctx_method_supported(int32_t method, const struct llama_model * model,
                                           char * err, size_t err_size);
/* the method that runs on the model when the caller asks for method: auto is vanilla on a model that only vanilla
 * runs (why: the reason; "" otherwise), every other method itself */
FARCTX_API int32_t farctx_method_for_model(int32_t method, const struct llama_model * model,
                                           char * why, size_t why_size);

/*
 * A fixed-cache method whose n_local is left 0 runs the window of its default (n_ctx_train) when the KV cache holds
 * head + n_local + n_ubatch cells; in a smaller cache (the caller's n_ctx as a memory budget) its window is the room
 * the cache leaves, cells - head - n_ubatch, if that is at least this many tokens (else the session is refused with
 * the sizes). An n_local given by the caller is never changed.
 */
enum { FARCTX_FIT_LOCAL_MIN = 64 };

/*
 * KV cells a stream needs under params, for a model trained on n_ctx_train tokens (used when params->n_ctx_train is
 * 0): a fixed-cache method head + n_local + n_ubatch, whatever the stream's length; the others n_prompt + n_predict,
 * or n_ctx_train when both are 0. The cache a context is made with is farctx_context_plan's, which asks this.
 */
FARCTX_API int64_t farctx_cache_cells(const struct farctx_params * params, int32_t n_ctx_train, int32_t n_ubatch,
                                      int64_t n_prompt, int64_t n_predict);

/* the batch sizes a plan takes when the caller sets none (llama-cpp-python's), and the cache of a whole-stream method
 * when neither the cache nor the stream's length is given: this many times the trained context */
enum { FARCTX_N_BATCH_DEFAULT = 512, FARCTX_N_UBATCH_DEFAULT = 512, FARCTX_WHOLE_STREAM_DEFAULT = 4 };

/* what a context plan is asked for: the model's facts and the caller's sizes (0: unset) */
struct farctx_plan_params {
    int32_t n_ctx_train;   /* the model's trained context (params->n_ctx_train, if set, wins)             */
    int32_t n_swa;         /* the model's sliding window; 0: no sliding-window layers                     */
    int32_t n_ctx;         /* cells of all streams together (llama.cpp's -c); 0: what the method needs    */
    int32_t n_batch;       /* 0: FARCTX_N_BATCH_DEFAULT                                                   */
    int32_t n_ubatch;      /* 0: the default, or what a fixed cache of the caller's size leaves room for  */
    int32_t n_seq;         /* streams, one KV stream each                                                 */
    int64_t n_prompt;      /* the stream's length when known (n_ctx 0, whole-stream methods)             */
    int64_t n_predict;
};

/* what a context under a method holds */
struct farctx_plan {
    int32_t n_ctx;         /* cells to make the context with (all streams: llama_context_params.n_ctx)    */
    int32_t n_ctx_seq;     /* cells per stream, as llama.cpp makes them of n_ctx (rounded up to 256)      */
    int32_t n_batch;       /* in force: at most the cells (llama.cpp's clamp)                             */
    int32_t n_ubatch;      /* in force: at most n_batch, fitted to a fixed cache when unset              */
    int32_t n_local;       /* fixed-cache methods: the window in force; 0 for the others                  */
    bool    window_fitted; /* n_local was unset and is the room the cache leaves                          */
};

FARCTX_API struct farctx_plan_params farctx_plan_default_params(void);

/*
 * The context a stream of `params` needs (or runs in, for a given n_ctx): the one decider of its cells, its batch
 * sizes and its window. A fixed-cache method takes head + n_local + n_ubatch cells when n_ctx is 0; in a cache of
 * the caller's size its ubatch (when unset) and its window (when n_local is unset) are fitted to the room. A
 * whole-stream method takes n_ctx, else the stream's length, else n_ctx_train (stock graph) or
 * FARCTX_WHOLE_STREAM_DEFAULT x n_ctx_train. Returns FARCTX_OK, or FARCTX_ERR_PARAM with every size in err when
 * the cache cannot hold the method.
 */
FARCTX_API int32_t farctx_context_plan(
        const struct farctx_params      * params,
        const struct farctx_plan_params * in,
        struct farctx_plan              * out,
        char * err, size_t err_size);

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

/* progress of a long feed: return false to cancel (the tokens fed so far stay in the cache) */
typedef bool (*farctx_progress_cb)(void * user_data, int64_t n_done, int64_t n_total);

/* a token stream through one sequence of a llama_context, under one method */
struct farctx_session;

/* NULL on error, with the message in err */
FARCTX_API struct farctx_session * farctx_session_init(
        struct llama_context * ctx,
        const struct farctx_params * params,
        char * err, size_t err_size);

/*
 * A stream through sequence seq_id of a context that holds several (n_seq_max > 1, kv_unified = false: one KV
 * stream of n_ctx / n_seq_max cells per sequence); farctx_session_init is this with seq_id 0. Each session has
 * its own method and state; feed them one by one (farctx_session_feed) or together (farctx_sessions_feed).
 */
FARCTX_API struct farctx_session * farctx_session_init_seq(
        struct llama_context * ctx,
        const struct farctx_params * params,
        int32_t seq_id,
        char * err, size_t err_size);

FARCTX_API void farctx_session_free(struct farctx_session * session);

/*
 * Feed tokens after the ones already in the stream: the one-session case of farctx_sessions_feed (one feed loop,
 * one chunking rule: each llama_decode holds at most the context's n_ubatch tokens, cut where the method's segment
 * ends).
 * logits: NULL, or room for n_vocab floats (all_logits false: the last token's) or
 * n_tokens*n_vocab floats (all_logits true: every token's, in order). The context keeps the last
 * token's logits either way (llama_get_logits_ith(ctx, -1), what a sampler reads), as llama.cpp does
 * for any batch; with all_logits, every token of the last chunk. progress (may be NULL) is called after each
 * llama_decode with (tokens done, n_tokens); returning false cancels (FARCTX_ERR_CANCELLED; the tokens decoded
 * so far stay in the stream).
 */
FARCTX_API int32_t farctx_session_feed(
        struct farctx_session * session,
        const int32_t * tokens, int32_t n_tokens,
        bool all_logits, float * logits,
        farctx_progress_cb progress, void * progress_data);

/*
 * Feed several sessions of one context together: n_tokens[i] tokens (tokens[i]) after session i's stream (0: none),
 * in chunks of at most n_ubatch tokens in all per llama_decode (the rule of farctx_session_feed, which is this call
 * for one session). Sessions whose next chunks have the same length and graph settings share a llama_decode (one
 * row per sequence: decoding N streams costs about one weight pass, not N). logits: NULL, or room for
 * n_sessions * n_vocab floats; row i receives the logits of session i's last token (left alone where n_tokens[i]
 * is 0). On an error no session keeps the tokens of the failing llama_decode; tokens decoded before it stay
 * (farctx_session_stats' n_past tells each session's), *failed (may be NULL) is the index of the session at fault
 * and farctx_session_error(sessions[*failed]) the message.
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
    int32_t n_cache_rotations; /* mesa, dca: times the cached keys were rotated in place
                                  (mesa: to the stair in the last chunk or the first generated
                                  token, at each stair move, back after a rewind; dca: when the
                                  query's phase changes, at most twice per chunk) */
    int32_t n_local;           /* fixed-cache methods: the window in force (0 for the others) */
    bool    window_fitted;     /* n_local was left 0 and the KV cache cannot hold its default: the window is
                                  the room the cache leaves (cells - head - n_ubatch) */
    int64_t n_prompt_planned;  /* mesa: the prompt length its chunks are planned for (farctx_mesa_schedule), 0
                                  before the first feed; a new prompt of another plan is read from its start */
};

FARCTX_API void farctx_session_stats(const struct farctx_session * session, struct farctx_stats * stats);

/* the parameters in force (defaults resolved against the model) */
FARCTX_API struct farctx_params farctx_session_params(const struct farctx_session * session);

/*
 * The stream's own state, beside llama.cpp's (llama_state_get_data / llama_state_seq_get_data): the tokens fed,
 * what was evicted, the method's plan (Mesa's chunks and stair). Saving both and loading both restores a stream
 * exactly. farctx_session_state_size: the bytes a save takes. farctx_session_state_get writes the state into dst
 * (size bytes of room) and returns the bytes written, 0 if size is too small. farctx_session_state_set loads a
 * state saved from a session of the same method and parameters (FARCTX_ERR_PARAM with the reason otherwise, the
 * session left as it was); it does not touch the KV cache, whose state is llama.cpp's to load.
 */
FARCTX_API size_t  farctx_session_state_size(const struct farctx_session * session);
FARCTX_API size_t  farctx_session_state_get(const struct farctx_session * session, uint8_t * dst, size_t size);
FARCTX_API int32_t farctx_session_state_set(struct farctx_session * session, const uint8_t * src, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FARCTX_H */

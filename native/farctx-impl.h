/* farctx internals shared by the native/ sources (not installed, not part of the API) */
#pragma once

#include "farctx.h"
#include "llama.h"

#include <stdarg.h>

#define FARCTX_ERR_LEN 512

/* indices of the parameter table (farctx-methods.c), in the order of struct farctx_params' fields */
enum farctx_param_index {
    FARCTX_PARAM_N_CTX_TRAIN = 0,
    FARCTX_PARAM_N_GLOBAL,
    FARCTX_PARAM_N_LOCAL,
    FARCTX_PARAM_N_SINK,
    FARCTX_PARAM_FIRST_CHUNK,
    FARCTX_PARAM_STAIR_WIDTH,
    FARCTX_PARAM_LAST_CONTEXT,
    FARCTX_PARAM_GEN_BUDGET,
    FARCTX_PARAM_GROUP,
    FARCTX_PARAM_NEIGHBOR,
    FARCTX_PARAM_CHUNK_SIZE,
    FARCTX_PARAM_LOCAL_WINDOW,
    FARCTX_PARAM_SHIFTED_OFFSET,
    FARCTX_PARAM_LOCAL_VALUE,
    FARCTX_PARAM_COUNT
};

struct farctx_session;

/*
 * A method as operations of the session driver (farctx-session.c, farctx-feed.c), which names no method. NULL: the
 * default given with each operation. `rule`: the method's data for operations shared by a family.
 */
struct farctx_method_ops {
    /* the n_local that 0 means, n_ctx_train set (NULL: n_ctx_train) */
    int32_t (*local_default)(const struct farctx_params * p);
    /* the method's own parameters that 0 means, n_ctx_train set (NULL: none) */
    void    (*resolve)(struct farctx_params * p);
    /* checks of the resolved parameters against each other (NULL: none) */
    int32_t (*validate)(const struct farctx_params * p, char * err, size_t err_size);
    /* bytes of the method's own state (s->state), zeroed at session init and freed with the session (0: none) */
    size_t  state_size;
    /* set-up after the parameters are resolved: parameters that depend on the context (NULL: none) */
    int32_t (*init)(struct farctx_session * s, char * err, size_t err_size);
    /* the attention mechanism's settings (fill callback, segments, deltas) */
    void    (*setup)(struct farctx_session * s, struct llama_attn_extrap_params * out);
    /* queries below this position see exactly what vanilla attention shows them: the stock graph runs */
    int64_t (*plain_below)(const struct farctx_session * s);
    /* first position beyond the head tokens that a query at next_pos still reads (NULL: 0, every key) */
    int64_t (*first_needed)(const struct farctx_params * p, int64_t next_pos);
    /* a feed of n_tokens starts at s->n_past (NULL: nothing to do) */
    void    (*begin_feed)(struct farctx_session * s, int32_t n_tokens);
    /* the position where the segment holding pos ends, n_left tokens still to feed: a llama_decode never crosses
     * it (NULL: none) */
    int64_t (*segment_end)(const struct farctx_session * s, int64_t pos, int32_t n_left);
    /* the graph settings of a batch of n_tokens at pos past the plain range (ex holds the method's) */
    void    (*batch_params)(const struct farctx_session * s, int64_t pos, int32_t n_tokens,
                            struct llama_attn_extrap_params * ex);
    /* before llama_decode of the batch of n_tokens at pos (NULL: nothing) */
    int32_t (*before_decode)(struct farctx_session * s, int64_t pos, int32_t n_tokens);
    /* after it, the batch at s->n_past: computed, whether its graph ran (NULL: nothing) */
    void    (*end_decode)(struct farctx_session * s, bool computed);
    /* the stream is cut to n_keep: FARCTX_OK, or FARCTX_ERR_REPLAY if it cannot be (NULL: always can) */
    int32_t (*rewind)(struct farctx_session * s, int64_t n_keep);
    /* the method's counters */
    void    (*stats)(const struct farctx_session * s, struct farctx_stats * stats);
    /* the method's state for farctx_session_state_get: its bytes, written into dst unless dst is NULL (NULL: none) */
    size_t  (*state_write)(const struct farctx_session * s, uint8_t * dst);
    /* load what state_write wrote (n bytes): FARCTX_OK or FARCTX_ERR_PARAM (NULL: no state) */
    int32_t (*state_read)(struct farctx_session * s, const uint8_t * src, size_t n);
    const void * rule;
};

/* one row of the method table: the public facts and the operations */
struct farctx_method_def {
    struct farctx_method_info info;
    const struct farctx_method_ops * ops;
};

/* the row of a method, NULL for an unknown one */
const struct farctx_method_def * farctx_method_def(int32_t method);

/* the operations of each method (farctx-method-*.c), named in the table (farctx-methods.c) */
extern const struct farctx_method_ops farctx_vanilla_ops;
extern const struct farctx_method_ops farctx_lminf_ops;
extern const struct farctx_method_ops farctx_window_ops;
extern const struct farctx_method_ops farctx_lambda_only_ops;
extern const struct farctx_method_ops farctx_rerope_ops;
extern const struct farctx_method_ops farctx_streaming_ops;
extern const struct farctx_method_ops farctx_selfextend_ops;
extern const struct farctx_method_ops farctx_mesa_ops;
extern const struct farctx_method_ops farctx_dca_ops;
extern const struct farctx_method_ops farctx_string_ops;
extern const struct farctx_method_ops farctx_auto_ops;

struct farctx_session {
    struct llama_context * ctx;
    const struct llama_model * model;
    llama_seq_id seq;              /* the sequence (KV stream) of the context that holds the stream */
    struct farctx_params params;   /* defaults resolved */
    const struct farctx_method_ops * ops;
    void  * state;                 /* the method's own (ops->state_size bytes) */
    int64_t n_past;                /* tokens fed so far                 */
    int32_t n_decode;              /* llama_decode calls                */
    bool    fill_error;            /* the method refused a ubatch       */
    int64_t evicted_to;            /* positions [head, evicted_to) left the cache */
    bool    window_fitted;         /* n_local is the room of a cache too small for the default window */
    struct llama_attn_extrap_params custom;  /* the method's graph settings                          */
    struct llama_attn_extrap_params active;  /* the settings of the llama_decode this stream is in (custom,
                                                NONE, per batch): what its callback fills for */
    int32_t * k_step;              /* scratch of farctx_session_move_keys (one rotation per position), made on first use */
    char    error[FARCTX_ERR_LEN];
};

/* whether the session's method keeps a fixed cache (evicts as the stream grows) */
bool farctx_session_fixed_cache(const struct farctx_session * s);

/* first position beyond the head tokens that a query at next_pos still reads (0: every key) */
int64_t farctx_session_first_needed(const struct farctx_session * s, int64_t next_pos);

/* mask rows from runs of cells (a stream fed in order: O(cells) stores, no test per cell) */
/* row[c] = 0 for the cells c in [a, b), -inf elsewhere (a and b clamped to the row) */
void    farctx_mask_run(float * row, int32_t n, int64_t a, int64_t b);
/* the cells in position order: cells [0, m) hold positions p0, p0 + 1, ... and the rest are empty (a stream fed in
 * order, as farctx feeds it). Returns m and sets *p0, or returns -1 */
int32_t farctx_cells_in_order(const int32_t * kv_pos, int32_t n_kv, int64_t * p0);

/* where a method's cache layout `layout` keeps key j, relative to its true position */
typedef int64_t (*farctx_key_offset_fn)(const struct farctx_params * p, int64_t layout, int64_t j);

/* moves the stream's cached keys [first, pos) from layout `from` to layout `to` in place, their positions kept
 * (llama_memory_seq_rotate_k: the K-shift at the start of the next llama_decode applies it); the keys before first
 * sit alike in both layouts. *moved: whether any key moved. FARCTX_OK, or FARCTX_ERR_DECODE with the message in the
 * session */
int32_t farctx_session_move_keys(struct farctx_session * s, int64_t first, int64_t pos, farctx_key_offset_fn offset,
                                 int64_t from, int64_t to, bool * moved);

/* the state (s->state) of a method whose cached keys sit where the segment that reads them needs them (dca, auto,
 * selfextend, rerope): the layout they hold (the method's own number, >= 0) and the times they moved */
struct farctx_key_layout {
    int64_t layout;
    int32_t n_cache_rotations;
};

static inline struct farctx_key_layout * farctx_key_layout_of(const struct farctx_session * s) {
    return (struct farctx_key_layout *) s->state;
}

/* moves the cached keys [first, pos) from the state's layout to `to` (farctx_session_move_keys) and records it */
int32_t farctx_key_layout_move(struct farctx_session * s, int64_t first, int64_t pos, farctx_key_offset_fn offset,
                               int64_t to);
/* the operations of such a method's state: its counter, and the layout a saved state carries */
void    farctx_key_layout_stats(const struct farctx_session * s, struct farctx_stats * st);
size_t  farctx_key_layout_write(const struct farctx_session * s, uint8_t * dst);
int32_t farctx_key_layout_read(struct farctx_session * s, const uint8_t * src, size_t n);
#define FARCTX_KEY_LAYOUT_OPS \
    .state_size  = sizeof(struct farctx_key_layout), \
    .stats       = farctx_key_layout_stats, \
    .state_write = farctx_key_layout_write, \
    .state_read  = farctx_key_layout_read

/* write a formatted one-line message into buf (buf may be NULL); returns code */
int32_t farctx_fail(char * buf, size_t size, int32_t code, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* the same into the session's error buffer */
#define farctx_session_fail(s, code, ...) farctx_fail((s)->error, sizeof((s)->error), (code), __VA_ARGS__)

/* fill 0 / negative fields from the model and the method defaults */
void farctx_params_resolve(struct farctx_params * p, const struct llama_model * model);

/* tokens at the head of the stream that are never evicted (the table's head parameter: globals, sinks) */
int32_t farctx_params_head(const struct farctx_params * p);


/* farctx internals shared by the native/ sources (not installed, not part of the API) */
#pragma once

#include "farctx.h"
#include "llama.h"

#include <stdarg.h>

#define FARCTX_ERR_LEN 512

/* Mesa-Extrapolation's plan for the current prompt (per session: no module-level state) */
struct farctx_mesa {
    bool    planned;
    bool    chunked;        /* the prompt is past L_tr - gen_budget            */
    int64_t n;              /* prompt length                                   */
    int64_t C;              /* chunk width                                     */
    int64_t N;              /* middle chunks                                   */
    int64_t last_S;         /* stair boundary of the last ubatch (-1: none)    */
    int32_t n_stair_moves;  /* times the boundary moved forward                */
    /* from S - 1 on (the last chunk's tail, generated tokens) the graph reads the cache as is, its keys
     * rotated in place to their stair positions. rot_S: the stair boundary the cached keys sit at (key j
     * at farctx_mesa_stair_pos(j, rot_S); 0: true positions). It holds for every cell: cells written
     * later sit at or above the batch's S - 1, where the stair is the identity, and a rewind only
     * removes cells */
    int64_t rot_S;
    int32_t * k_step;       /* scratch: the rotation to apply per position */
    int32_t n_cache_rotations; /* times the cache was rotated in place         */
};

struct farctx_session {
    struct llama_context * ctx;
    const struct llama_model * model;
    struct farctx_params params;   /* defaults resolved */
    int64_t n_past;                /* tokens fed so far                 */
    int32_t n_decode;              /* llama_decode calls                */
    bool    fill_error;            /* the policy refused a ubatch       */
    int64_t evicted_to;            /* positions [n_global, evicted_to) left the cache */
    struct farctx_mesa mesa;
    struct llama_attn_extrap_params custom;  /* the method's graph settings                          */
    struct llama_attn_extrap_params active;  /* what the context runs now (custom, NONE, mesa middle) */
    char    error[FARCTX_ERR_LEN];
};

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

/* policy (farctx-policy.c): the attention mechanism's settings for the method, the fill callback,
 * and the cache it needs */
int32_t farctx_policy_setup(const struct farctx_session * s, struct llama_attn_extrap_params * out);
int32_t farctx_policy_fill(void * user_data, struct llama_attn_extrap_ubatch * ub);
/* the graph settings for a batch of n_tokens (past the plain range): a single query of a method with head
 * tokens (lminf, streaming) reads them as a second segment under its own query (kv_first) */
void    farctx_policy_batch_params(const struct farctx_session * s, int32_t n_tokens, struct llama_attn_extrap_params * ex);
/* first position (beyond the global tokens) that the query at next_pos can still read */
int64_t farctx_policy_first_needed(const struct farctx_session * s, int64_t next_pos);
/* farctx_method_fixed_cache for the params' method */
bool farctx_policy_fixed_cache(const struct farctx_params * p);
/* tokens at the head of the stream that are never evicted (globals, sinks) */
int32_t farctx_policy_head(const struct farctx_params * p);
/* queries at positions below this see exactly what vanilla attention shows them (every earlier key,
 * true distances, no scale): the stock graph computes them (no second segment, flash attention) */
int64_t farctx_policy_plain_below(const struct farctx_session * s);

/* Mesa-Extrapolation (farctx-mesa.c) */
void    farctx_mesa_plan(struct farctx_session * s, int64_t n);
int32_t farctx_mesa_fill(struct farctx_session * s, struct llama_attn_extrap_ubatch * ub);
/* the position where the segment of query i ends (a batch never crosses it) */
int64_t farctx_mesa_segment_end(const struct farctx_session * s, int64_t i);
int64_t farctx_mesa_stair_pos(int64_t j, int64_t S, int64_t E);
/* the graph settings for a batch starting at pos: a middle chunk reads the first chunk as a second
 * segment and only its own cells as the main one (nothing rotated but the first chunk's keys) */
void    farctx_mesa_batch_params(const struct farctx_session * s, int64_t pos, struct llama_attn_extrap_params * ex);
/* before the batch at pos (= n_past): rotate the cached keys in place to what that batch's graph reads as
 * is: stair positions for a stair-regime batch from S - 1 on, true positions for everything else */
int32_t farctx_mesa_rotate_cache(struct farctx_session * s, int64_t pos);

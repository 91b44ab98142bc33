/* farctx: a stream's state: its llama.cpp sequence, its position and its method's own (farctx.h) */
#include "farctx-impl.h"

#include <string.h>

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

/* what farctx_session_state_get keeps of a method whose keys move: where the saved keys sit */
struct key_layout_saved {
    int64_t layout;
    int32_t n_cache_rotations, pad;
};

void farctx_key_layout_stats(const struct farctx_session * s, struct farctx_stats * st) {
    st->n_cache_rotations = farctx_key_layout_of(s)->n_cache_rotations;
}

size_t farctx_key_layout_write(const struct farctx_session * s, uint8_t * dst) {
    if (dst != NULL) {
        struct key_layout_saved v;
        memset(&v, 0, sizeof(v));
        v.layout = farctx_key_layout_of(s)->layout;
        v.n_cache_rotations = farctx_key_layout_of(s)->n_cache_rotations;
        memcpy(dst, &v, sizeof(v));
    }
    return sizeof(struct key_layout_saved);
}

int32_t farctx_key_layout_read(struct farctx_session * s, const uint8_t * src, size_t n) {
    struct key_layout_saved v;
    if (n != sizeof(v)) {
        return farctx_session_fail(s, FARCTX_ERR_PARAM, "not a %s stream state (%zu bytes)",
                                   farctx_method_name(s->params.method), n);
    }
    memcpy(&v, src, sizeof(v));
    if (v.layout < 0) {
        return farctx_session_fail(s, FARCTX_ERR_PARAM, "not a %s stream state (layout %lld)",
                                   farctx_method_name(s->params.method), (long long) v.layout);
    }
    farctx_key_layout_of(s)->layout = v.layout;
    farctx_key_layout_of(s)->n_cache_rotations = v.n_cache_rotations;
    return FARCTX_OK;
}

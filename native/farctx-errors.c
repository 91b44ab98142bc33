/* farctx: error messages */
#include "farctx-impl.h"

#include <stdio.h>

int32_t farctx_fail(char * buf, size_t size, int32_t code, const char * fmt, ...) {
    if (buf != NULL && size > 0) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(buf, size, fmt, args);
        va_end(args);
    }
    return code;
}

const char * farctx_session_error(const struct farctx_session * session) {
    return session ? session->error : "no session";
}

/* Preloaded into a benchmark process (LD_PRELOAD): counts the wall time spent inside
 * ggml_backend_sched_graph_compute_async, through which llama.cpp computes every graph (the
 * model's and the K-shift's). On the CPU backend the compute is synchronous inside that call, so
 * (time of a decode call) - (time in here) = the host work around the graph: batch handling,
 * graph build or reuse, scheduling, input fill (the KQ mask), outputs, and the callers' own work.
 *
 * FARCTX_HOST_SHIM_SKIP_COMPUTE=1: the graphs are not computed at all (every output is garbage), so that
 * the host work alone can be repeated quickly or counted by an instruction-level tool: under valgrind's
 * callgrind (started with --collect-atstart=no), farctx_host_shim_count(1) starts counting and
 * farctx_host_shim_count(0, name) stops and writes the count as a dump named after `name`. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define FARCTX_HAVE_CALLGRIND 1
#endif
#endif

typedef int (*compute_fn)(void * sched, void * graph);

static compute_fn real_compute;
static uint64_t   compute_ns;
static uint64_t   compute_calls;
static int        skip_compute = -1;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t) t.tv_sec * 1000000000ull + (uint64_t) t.tv_nsec;
}

int ggml_backend_sched_graph_compute_async(void * sched, void * graph) {
    if (real_compute == NULL) {
        real_compute = (compute_fn) dlsym(RTLD_NEXT, "ggml_backend_sched_graph_compute_async");
    }
    if (real_compute == NULL) {
        /* loaded with dlopen(RTLD_LOCAL) by ctypes: not in the global scope, but loaded */
        void * base = dlopen("libggml-base.so", RTLD_LAZY | RTLD_NOLOAD);
        if (base == NULL) {
            base = dlopen("libggml-base.so.0", RTLD_LAZY | RTLD_NOLOAD);
        }
        real_compute = base ? (compute_fn) dlsym(base, "ggml_backend_sched_graph_compute_async") : NULL;
    }
    if (skip_compute < 0) {
        const char * v = getenv("FARCTX_HOST_SHIM_SKIP_COMPUTE");
        skip_compute = v != NULL && v[0] == '1';
    }
    const uint64_t t0 = now_ns();
    const int status = skip_compute ? 0 : real_compute(sched, graph);
    compute_ns += now_ns() - t0;
    compute_calls++;
    return status;
}

uint64_t farctx_host_shim_compute_ns(void) { return compute_ns; }
uint64_t farctx_host_shim_compute_calls(void) { return compute_calls; }

/* 1 when built with valgrind's headers: farctx_host_shim_count counts under callgrind */
int farctx_host_shim_can_count(void) {
#ifdef FARCTX_HAVE_CALLGRIND
    return 1;
#else
    return 0;
#endif
}

/* 1: without valgrind's headers at build time, counting is not available */
int farctx_host_shim_count(int on, const char * name) {
#ifdef FARCTX_HAVE_CALLGRIND
    if (on) {
        CALLGRIND_ZERO_STATS;
        CALLGRIND_TOGGLE_COLLECT;
    } else {
        CALLGRIND_TOGGLE_COLLECT;
        CALLGRIND_DUMP_STATS_AT(name);
    }
    return 0;
#else
    (void) on;
    (void) name;
    return 1;
#endif
}

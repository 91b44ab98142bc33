/*
 * Every method through libfarctx's C API and llama.h alone (no Python): a prompt past the model's trained
 * context, then greedy decoding, flash attention off and on, F32 and F16 caches. Prints one line per run: the
 * tokens it chose, the largest logit of its last step, the cells in use and the llama_decode calls.
 * scripts/rebase-check runs it against the pinned build and a build on a newer llama.cpp and compares the lines.
 *
 *   farctx-smoke MODEL [N_PROMPT [N_GEN]]
 */
#include "farctx.h"
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level; (void) text; (void) user_data;
}

static int argmax(const float * v, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i) {
        if (v[i] > v[best]) {
            best = i;
        }
    }
    return best;
}

/* one method, one cache type, flash attention on or off: 0 when it ran */
static int run(const struct llama_model * model, int32_t method, enum ggml_type type, bool flash_attn,
               int32_t n_prompt, int32_t n_gen) {
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);

    struct farctx_params fp = farctx_default_params();
    fp.method = method;
    if (method == farctx_method_from_name("mesa")) {  /* chunks and stair moves on a short trained context */
        fp.first_chunk = 4; fp.stair_width = 2; fp.last_context = 8; fp.gen_budget = 2;
    }
    struct farctx_plan_params pp = farctx_plan_default_params();
    pp.n_ctx_train = llama_model_n_ctx_train(model);
    pp.n_ubatch    = 16;
    pp.n_batch     = 64;
    pp.n_prompt    = n_prompt;
    pp.n_predict   = n_gen;
    struct farctx_plan plan;
    char err[512];
    if (farctx_context_plan(&fp, &pp, &plan, err, sizeof(err)) != FARCTX_OK) {
        printf("%s: no plan: %s\n", farctx_method_name(method), err);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ubatch = (uint32_t) plan.n_ubatch;
    cp.n_batch  = (uint32_t) plan.n_batch;
    cp.n_ctx    = (uint32_t) plan.n_ctx;
    cp.type_k = type;
    cp.type_v = type;
    cp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.n_threads = cp.n_threads_batch = 2;
    struct llama_context * ctx = llama_init_from_model((struct llama_model *) model, cp);
    if (ctx == NULL) {
        printf("%s: no context\n", farctx_method_name(method));
        return 1;
    }
    struct farctx_session * s = farctx_session_init(ctx, &fp, err, sizeof(err));
    if (s == NULL) {
        printf("%s: %s\n", farctx_method_name(method), err);
        llama_free(ctx);
        return 1;
    }
    int32_t * tokens = malloc(sizeof(int32_t) * (size_t) n_prompt);
    for (int32_t i = 0; i < n_prompt; ++i) {
        tokens[i] = 1 + (int32_t) ((i * 7919u + 13u) % 250u);  /* a fixed, non-repeating stream */
    }
    float * logits = malloc(sizeof(float) * (size_t) n_vocab);
    int rc = farctx_session_feed(s, tokens, n_prompt, false, logits, NULL, NULL);
    printf("%-11s %-3s fa=%d:", farctx_method_name(method), ggml_type_name(type), flash_attn ? 1 : 0);
    for (int32_t i = 0; rc == FARCTX_OK && i < n_gen; ++i) {
        int32_t next = argmax(logits, n_vocab);
        printf(" %d", next);
        rc = farctx_session_feed(s, &next, 1, false, logits, NULL, NULL);
    }
    if (rc != FARCTX_OK) {
        printf(" FAILED: %s\n", farctx_session_error(s));
    } else {
        struct farctx_stats st;
        farctx_session_stats(s, &st);
        printf(" | max %.4f | cells %lld | decodes %d\n", logits[argmax(logits, n_vocab)],
               (long long) st.n_cells_used, st.n_decode);
    }
    free(logits);
    free(tokens);
    farctx_session_free(s);
    llama_free(ctx);
    return rc == FARCTX_OK ? 0 : 1;
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [N_PROMPT [N_GEN]]\n", argv[0]);
        return 2;
    }
    const int32_t n_prompt = argc > 2 ? atoi(argv[2]) : 100;
    const int32_t n_gen    = argc > 3 ? atoi(argv[3]) : 30;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (model == NULL) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    int failed = 0;
    const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16 };
    for (int32_t m = 0; m < farctx_method_count(); ++m) {
        if (!farctx_method_available(m) || farctx_method_supported(m, model, NULL, 0) != FARCTX_OK) {
            continue;
        }
        for (int t = 0; t < 2; ++t) {
            for (int fa = 0; fa < 2; ++fa) {
                failed += run(model, m, types[t], fa == 1, n_prompt, n_gen);
            }
        }
    }
    llama_model_free(model);
    llama_backend_free();
    return failed == 0 ? 0 : 1;
}

// farctx: attention extrapolation (llama_set_attn_extrap, mode CUSTOM), the mechanism: the graph inputs that the
// fill callback writes per ubatch, and the attention graph that reads them. Compiled into libllama by farctx's
// CMake and reached from llama-graph.cpp's hook lines (patches/0014) through llm_graph_input_attn_kv (its `extrap`
// inputs: build, set, can_reuse) and llm_graph_context::build_attn. How it builds the graph: README.md here.
#include "llama-attn-extrap.h"

#include "llama-impl.h"
#include "llama-batch.h"
#include "llama-cparams.h"
#include "llama-graph.h"
#include "llama-kv-cache.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>

// KV streams of a ubatch's graph: one per sequence without a unified cache (the ubatch's sequences are consecutive
// streams, n_tokens/n_stream queries each), as the stock mask counts them
static int64_t extrap_n_stream(const llama_cparams & cparams, const llama_ubatch & ubatch) {
    return cparams.kv_unified ? 1 : std::max<int64_t>(ubatch.n_seqs_unq, 1);
}

// One query whose second segment shares its rotation (kv_first) with flash attention and an F16 cache: the
// second segment's keys (rotated for the query) and values go into free cells of the cache in view, and flash
// attention reads the cache view as stock does (no copy of the cells). Needs n_seg2 free cells in view;
// otherwise the log-sum-exp merge (host memory) or the concatenation of both cell ranges (elsewhere)
static bool extrap_display_cells(const llama_cparams & cparams, const llama_ubatch & ubatch,
        const llama_kv_cache_context * mctx, int64_t n_kv) {
    const auto & ex = cparams.attn_extrap;
    const int64_t n_stream = extrap_n_stream(cparams, ubatch);
    if (!cparams.flash_attn || ubatch.n_tokens != n_stream || ex.n_seg2 <= 0 || ex.kv_first <= 0 ||
            ex.kv_first >= n_kv || ex.use_k_delta || mctx->type_k() != GGML_TYPE_F16 || mctx->type_v() != GGML_TYPE_F16 ||
            ubatch.seq_id == nullptr) {
        return false;
    }
    // one query per stream: every stream needs the free cells
    std::vector<int32_t> pos(n_kv);
    for (int64_t s = 0; s < n_stream; ++s) {
        if (ubatch.seq_id[s] == nullptr) {
            return false;
        }
        mctx->get_cell_pos(ubatch.seq_id[s][0], pos.data(), (int32_t) n_kv);
        if (std::count(pos.begin(), pos.end(), -1) < std::min<int64_t>(ex.n_seg2, n_kv)) {
            return false;
        }
    }
    return true;
}

// the first cell of the main segment (kv_first, unless the cells in view end before it)
static int64_t extrap_main_first_cell(const llama_attn_extrap_params & ex, int64_t n_kv) {
    return ex.kv_first < n_kv ? ex.kv_first : 0;
}

// whether the graph takes the layouts of a cache outside host memory. A GPU backend may require aligned
// buffer offsets (Vulkan asserts on a transposed V or mask column view at an odd cell): there the views
// start at the main segment's first cell rounded down to 256 cells (offsets of at least 256 elements for
// every cache type), the cells in between masked, and neither segment merges by log-sum-exp (a CPU-only
// node). LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT=1 builds those graphs in host memory too: the CPU runs, and the
// tests check, what a GPU gets
static bool extrap_gpu_layouts(bool host) {
    static const bool device_layout = [] {
        const char * LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT = getenv("LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT");
        return LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT != nullptr && atoi(LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT) != 0;
    }();
    return !host || device_layout;
}

static int64_t extrap_view_first_cell(int64_t kv0, bool gpu_layouts) {
    return gpu_layouts ? kv0 - kv0 % 256 : kv0;
}

// the second segment as per-query copies of its keys, appended to the main segment, so that one flash-attention
// call computes both (no second softmax): with flash attention, several queries, the main segment over every
// cell (no kv_first) and a short second segment (LM-Infinite's globals, StreamingLLM's sinks). A flash-attention
// kernel computes the copies tile by tile: a tile of Q queries reads Q * n_seg2 of them (CPU: Q = 64), so the
// copies pay while n_seg2 is small. Measured on the CPU (attention-bound bench model, 8k, prefill against the
// two-segment softmax): n_seg2 2 1.8x, 4 1.28x, 10 0.95x, 20 0.51x. On a GPU the two-segment softmax
// materialises every logit: up to 32 keys there (not measured yet). In host memory the log-sum-exp path below
// takes every such ubatch, so this path serves the GPU layouts only
static bool extrap_per_query_seg2(const llama_cparams & cparams, int64_t n_seg2, int64_t n_tokens,
        int64_t first_cell) {
    const int64_t n_max = 32;
    return cparams.flash_attn && n_tokens > 1 && n_seg2 > 0 && n_seg2 <= n_max && first_cell == 0;
}

// the second segment by its own flash-attention call, merged with the main segment's through the log-sum-exp
// (ggml_flash_attn_ext_lse for the main segment, ggml_flash_attn_ext_merge_lse for the second: the kernel merges
// as it writes its rows): no copies of keys or cells, no materialised logits, no merge arithmetic in the graph.
// The CPU backend alone writes and merges the log-sum-exp, so only with the cache in host memory (and host
// layouts). Several queries, and one query: sharing its rotation (kv_first) only where the free cells above are
// not at hand (they measured faster than a second flash-attention node: 8k, attention-bound model), i.e. a
// quantized or F32 cache, or a fixed cache whose live cells fill its view exactly (streaming's 4 + 2044 = 8 x 256
// cells, every decoded token), where the concatenation of both cell ranges copied every cell per token. One query
// with a rotation of its own over every cell (SelfExtend's, ReRoPE's, DCA's decoding) measured 1.3-1.4x the
// two-segment softmax there, and 10x for DCA, whose keys need no rotated copy
static bool extrap_seg2_lse(const llama_cparams & cparams, bool gpu_layouts, int64_t n_seg2) {
    return cparams.flash_attn && !gpu_layouts && n_seg2 > 0;
}

// the input tensors of mode CUSTOM, built with the attention input (nothing for mode NONE)
void llama_attn_extrap_inputs::build(ggml_context * ctx0, const llama_ubatch & ubatch, const llama_cparams & cparams,
        const llama_kv_cache_context * mctx_cur, const ggml_tensor * kq_mask) {
    if (cparams.attn_extrap.mode != LLAMA_ATTN_EXTRAP_CUSTOM) {
        return;
    }

    const auto & ex = cparams.attn_extrap;

    const int64_t n_kv  = mctx_cur->get_n_kv();
    const int64_t n_tok = ubatch.n_tokens;

    n_stream = extrap_n_stream(cparams, ubatch);
    const int64_t n_tps = n_tok/n_stream;

    // decided once per graph, read by every layer's build_attn_extrap
    gpu_layouts = extrap_gpu_layouts(mctx_cur->in_host_memory());

    auto new_i32 = [&](int64_t n, const char * name) {
        ggml_tensor * t = ggml_new_tensor_1d(ctx0, GGML_TYPE_I32, n);
        ggml_set_input(t);
        ggml_set_name(t, name);
        return t;
    };

    if (ex.use_q_delta) {
        q_delta = new_i32(n_tok, "extrap_q_delta");
    }
    if (ex.use_k_delta) {
        k_delta = new_i32(n_kv*n_stream, "extrap_k_delta");
    }
    if (ex.use_q_scale) {
        q_scale = ggml_new_tensor_3d(ctx0, GGML_TYPE_F32, 1, 1, n_tok);
        ggml_set_input(q_scale);
        ggml_set_name(q_scale, "extrap_q_scale");
    }
    if (ex.n_k_move > 0) {
        k_move_gather  = new_i32(ex.n_k_move*n_stream, "extrap_k_move_gather");
        k_move_delta   = new_i32(ex.n_k_move*n_stream, "extrap_k_move_delta");
        k_move_scatter = ggml_new_tensor_1d(ctx0, GGML_TYPE_I64, ex.n_k_move*n_stream);
        ggml_set_input(k_move_scatter);
        ggml_set_name(k_move_scatter, "extrap_k_move_scatter");
    }
    if (ex.n_seg2 != 0) {
        const int64_t n_seg2 = ex.n_seg2 < 0 ? n_kv : std::min<int64_t>(ex.n_seg2, n_kv);
        seg2_mask = ggml_new_tensor_2d(ctx0, kq_mask->type, n_seg2, n_tok);
        ggml_set_input(seg2_mask);
        ggml_set_name(seg2_mask, "extrap_seg2_mask");
        seg2_q_delta = new_i32(n_tok,  "extrap_seg2_q_delta");
        if (ex.use_seg2_k_delta) {
            seg2_k_delta = new_i32(n_seg2*n_stream, "extrap_seg2_k_delta");
        }
        first_cell = extrap_main_first_cell(ex, n_kv);
        view_cell  = extrap_view_first_cell(first_cell, gpu_layouts);
        const bool display = extrap_display_cells(cparams, ubatch, mctx_cur, n_kv);
        if (display) {
            disp_idxs = ggml_new_tensor_1d(ctx0, GGML_TYPE_I64, n_seg2*n_stream);
            ggml_set_input(disp_idxs);
            ggml_set_name(disp_idxs, "extrap_disp_idxs");
        }
        seg2_lse   = !display && extrap_seg2_lse(cparams, gpu_layouts, n_seg2);
        if (!seg2_lse && extrap_per_query_seg2(cparams, n_seg2, n_tps, first_cell)) {
            pq_k_delta = new_i32(n_seg2*n_tok, "extrap_pq_k_delta");
            pq_mask = ggml_new_tensor_2d(ctx0, kq_mask->type, n_seg2*n_tps, n_tok);
            ggml_set_input(pq_mask);
            ggml_set_name(pq_mask, "extrap_pq_mask");
        }
    }
}

// a mask row to F16: the masks hold 0 and -inf (llama.h), whose encodings are written directly by a loop that
// vectorizes; a row with any other value goes through ggml's conversion (a software one in a build without F16C,
// 10x slower per entry)
static void extrap_mask_to_f16(const float * src, ggml_fp16_t * dst, int64_t n) {
    const uint32_t zero = 0, neg_inf = 0xFF800000u;
    uint32_t other = 0;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        memcpy(&u, src + i, sizeof(u));
        dst[i] = u == zero ? (ggml_fp16_t) 0 : (ggml_fp16_t) 0xFC00;
        other |= (uint32_t) (u != zero && u != neg_inf);
    }
    if (other != 0) {
        for (int64_t i = 0; i < n; ++i) {
            dst[i] = ggml_fp32_to_fp16(src[i]);
        }
    }
}

// per ubatch: the callback decides the mask, the RoPE deltas and the second segment
void llama_attn_extrap_inputs::set(const llama_ubatch * ubatch, const llama_cparams & cparams,
        const llama_kv_cache_context * mctx, ggml_tensor * kq_mask) {
    const auto & ex = cparams.attn_extrap;

    const int32_t n_tokens = ubatch->n_tokens;
    const int32_t n_cells  = kq_mask->ne[0];
    const int32_t n_seg2   = seg2_mask ? seg2_mask->ne[0] : 0;
    // the main segment: cells [kv0, n_cells); the mask columns below kv0 are never read
    const int32_t kv0      = (int32_t) first_cell;
    const int32_t n_kv     = n_cells - kv0;

    // several sequences: stream s holds queries [s*n_tps, (s + 1)*n_tps) and its own cells; the per-query
    // buffers run over every query, the per-cell ones hold a run per stream
    const int32_t n_str    = (int32_t) n_stream;
    const int32_t n_tps    = n_tokens/n_str;
    GGML_ASSERT(kq_mask->ne[1] == n_tps && kq_mask->ne[3] == n_str && n_tps*n_str == n_tokens);

    // the host buffers outlive the graph (llm_graph_result::attn_extrap_host): no allocation, and no page faults
    // on a fresh mask, per ubatch
    host_buffers local;
    auto & b = host_bufs ? *host_bufs : local;
    b.q_pos.assign(ubatch->pos, ubatch->pos + n_tokens);
    b.kv_pos.resize((size_t) n_cells*n_str);

    // the callback writes every entry of both masks (the whole rule): they are not cleared first, and only grow
    // (a smaller ubatch uses their beginning). A mask in host memory that the main segment fills whole (F32,
    // every cell) is written by the callback in place
    const bool mask_in_place = kv0 == 0 && !disp_idxs && kq_mask->type == GGML_TYPE_F32 && kq_mask->buffer &&
                               ggml_backend_buffer_is_host(kq_mask->buffer) && ggml_is_contiguous(kq_mask);
    auto grow = [](std::vector<float> & v, size_t n) {
        if (v.size() < n) {
            v.resize(n);
        }
    };
    if (!mask_in_place) {
        grow(b.mask, (size_t) n_tokens*n_kv);
    }
    grow(b.mask2, (size_t) n_tokens*n_seg2);
    float * mask_rows = mask_in_place ? (float *) kq_mask->data : b.mask.data();
    b.q_delta.assign(n_tokens, 0);
    b.k_delta.assign((size_t) n_cells*n_str, 0);
    b.q_scale.assign(n_tokens, 1.0f);
    b.q2_delta.assign(n_tokens, 0);
    b.k2_delta.assign((size_t) n_seg2*n_str, 0);
    const int32_t n_move = k_move_delta ? (int32_t) (k_move_delta->ne[0]/n_str) : 0;
    b.move_cell.assign((size_t) n_move*n_str, -1);
    b.move_delta.assign((size_t) n_move*n_str, 0);

    for (int32_t st = 0; st < n_str; ++st) {
        const size_t t0  = (size_t) st*n_tps;   // first query of the stream
        const size_t c0  = (size_t) st*n_cells; // its run of per-cell entries
        const llama_seq_id seq = ubatch->seq_id[t0][0];
        mctx->get_cell_pos(seq, b.kv_pos.data() + c0, n_cells);

        llama_attn_extrap_ubatch ub = {
            /*.n_tokens     =*/ n_tps,
            /*.n_kv         =*/ n_kv,
            /*.n_seg2       =*/ n_seg2,
            /*.q_pos        =*/ b.q_pos.data() + t0,
            /*.kv_pos       =*/ b.kv_pos.data() + c0 + kv0,
            /*.mask         =*/ mask_rows + t0*n_kv,
            /*.q_delta      =*/ q_delta ? b.q_delta.data() + t0 : nullptr,
            /*.k_delta      =*/ k_delta ? b.k_delta.data() + c0 + kv0 : nullptr,
            /*.q_scale      =*/ q_scale ? b.q_scale.data() + t0 : nullptr,
            /*.seg2_mask    =*/ n_seg2 ? b.mask2.data() + t0*n_seg2    : nullptr,
            /*.seg2_q_delta =*/ n_seg2 ? b.q2_delta.data() + t0        : nullptr,
            /*.seg2_k_delta =*/ seg2_k_delta ? b.k2_delta.data() + (size_t) st*n_seg2 : nullptr,
            /*.seg2_pos     =*/ n_seg2 ? b.kv_pos.data() + c0          : nullptr,
            /*.seq_id       =*/ seq,
            /*.n_k_move     =*/ n_move,
            /*.k_move_cell  =*/ n_move ? b.move_cell.data() + (size_t) st*n_move : nullptr,
            /*.k_move_delta =*/ n_move ? b.move_delta.data() + (size_t) st*n_move : nullptr,
        };

        if (ex.fill(ex.user_data, &ub) != 0) {
            // the ubatch is not computed (process_ubatch fails it); the callback's owner keeps the reason
            if (fill_failed) {
                *fill_failed = true;
            }
            return;
        }
    }

    // src holds n_tokens rows of n columns; they go to columns [col0, col0 + n) of dst's rows (the rest is
    // left as it is). A host buffer (the mask's, as stock asserts) is written in place, converted on the way
    auto set_mask = [n_tokens, &b](ggml_tensor * dst, const float * src, int64_t n, int64_t col0) {
        const int64_t width = dst->ne[0];
        const int64_t n_all = n*n_tokens;
        const bool    whole = col0 == 0 && n == width;
        const bool    host  = dst->buffer && ggml_backend_buffer_is_host(dst->buffer);
        if (dst->type == GGML_TYPE_F16) {
            if (host) {
                ggml_fp16_t * out = (ggml_fp16_t *) dst->data;
                for (int64_t t = 0; t < n_tokens; ++t) {
                    extrap_mask_to_f16(src + t*n, out + t*width + col0, n);
                }
                return;
            }
            if (b.tmp16.size() < (size_t) n_all) {
                b.tmp16.resize(n_all);
            }
            extrap_mask_to_f16(src, b.tmp16.data(), n_all);
            if (whole) {
                ggml_backend_tensor_set(dst, b.tmp16.data(), 0, n_all*sizeof(ggml_fp16_t));
                return;
            }
            for (int64_t t = 0; t < n_tokens; ++t) {
                ggml_backend_tensor_set(dst, b.tmp16.data() + t*n, (t*width + col0)*sizeof(ggml_fp16_t), n*sizeof(ggml_fp16_t));
            }
        } else if (whole) {
            ggml_backend_tensor_set(dst, src, 0, n_all*sizeof(float));
        } else {
            for (int64_t t = 0; t < n_tokens; ++t) {
                ggml_backend_tensor_set(dst, src + t*n, (t*width + col0)*sizeof(float), n*sizeof(float));
            }
        }
    };
    auto set_i32 = [](ggml_tensor * dst, const std::vector<int32_t> & src) {
        if (dst && dst->buffer) {
            ggml_backend_tensor_set(dst, src.data(), 0, src.size()*sizeof(int32_t));
        }
    };

    if (disp_idxs) {
        // one query (per stream) over the whole cache view: the head cells masked (their rotated copies stand in
        // for them), the free cells that receive the copies masked as the second segment says
        b.gap.assign((size_t) n_cells*n_tokens, -INFINITY);
        b.disp.clear();
        for (int32_t st = 0; st < n_str; ++st) {
            const size_t c0 = (size_t) st*n_cells;
            std::copy(b.mask.begin() + (size_t) st*n_kv, b.mask.begin() + (size_t) (st + 1)*n_kv, b.gap.begin() + c0 + kv0);
            int32_t found = 0;
            for (int32_t c = 0; c < n_cells && found < n_seg2; ++c) {
                if (b.kv_pos[c0 + c] == -1) {
                    b.gap[c0 + c] = b.mask2[(size_t) st*n_seg2 + found];
                    b.disp.push_back(mctx->cell_row(ubatch->seq_id[st][0], c));
                    ++found;
                }
            }
            GGML_ASSERT(found == n_seg2 && "free cells for the second segment (checked by build/can_reuse)");
        }
        set_mask(kq_mask, b.gap.data(), n_cells, 0);
        if (disp_idxs->buffer) {
            ggml_backend_tensor_set(disp_idxs, b.disp.data(), 0, b.disp.size()*sizeof(int64_t));
        }
    } else if (!mask_in_place) {
        set_mask(kq_mask, b.mask.data(), n_kv, kv0);
    }
    if (!disp_idxs && view_cell < kv0) {
        // the graph's view starts before the main segment: those columns are not the segment's
        const int64_t gap = kv0 - view_cell;
        b.gap.assign((size_t) gap*n_tokens, -INFINITY);  // n_tokens rows of gap columns
        set_mask(kq_mask, b.gap.data(), gap, view_cell);
    }
    if (n_move > 0) {
        // the keys to rotate: cells of the main segment, each named once (set_rows writes each row once); as rows
        // of the stream's view
        b.move_row.resize(b.move_cell.size());
        std::vector<int32_t> & cells = b.move_cell;
        for (size_t m = 0; m < cells.size(); ++m) {
            if (cells[m] < 0 || cells[m] >= n_kv) {
                LLAMA_LOG_ERROR("%s: k_move_cell[%zu] = %d is not a cell of the ubatch's view (0 .. %d)\n", __func__,
                        m % n_move, cells[m], n_kv - 1);
                if (fill_failed) {
                    *fill_failed = true;
                }
                return;
            }
            cells[m] += kv0;
            b.move_row[m] = cells[m];
        }
        for (int32_t st = 0; st < n_str; ++st) {
            std::vector<int64_t> rows(b.move_row.begin() + (size_t) st*n_move, b.move_row.begin() + (size_t) (st + 1)*n_move);
            std::sort(rows.begin(), rows.end());
            if (std::adjacent_find(rows.begin(), rows.end()) != rows.end()) {
                LLAMA_LOG_ERROR("%s: k_move_cell names a cell twice\n", __func__);
                if (fill_failed) {
                    *fill_failed = true;
                }
                return;
            }
        }
        set_i32(k_move_gather, b.move_cell);
        set_i32(k_move_delta, b.move_delta);
        if (k_move_scatter->buffer) {
            ggml_backend_tensor_set(k_move_scatter, b.move_row.data(), 0, b.move_row.size()*sizeof(int64_t));
        }
    }
    set_i32(q_delta, b.q_delta);
    set_i32(k_delta, b.k_delta);
    if (q_scale && q_scale->buffer) {
        ggml_backend_tensor_set(q_scale, b.q_scale.data(), 0, b.q_scale.size()*sizeof(float));
    }
    if (n_seg2 && seg2_mask->buffer) {  // unread (no buffer) when the per-query copies replace it
        set_mask(seg2_mask, b.mask2.data(), n_seg2, 0);
    }
    if (n_seg2) {
        set_i32(seg2_q_delta, b.q2_delta);
        set_i32(seg2_k_delta, b.k2_delta);
    }
    if (pq_mask && pq_mask->buffer) {
        // query r scores key j of the second segment at (its position + q_delta) - (key position + delta): the
        // two-segment graph's distance, (q_pos + q2_delta) - (kv_pos + k2_delta), with the main query rotation
        // (several streams: query t = st*n_tps + r sees copy r of its stream's keys)
        const int64_t n_pq = (int64_t) n_seg2*n_tps;
        b.pq_delta.resize((size_t) n_seg2*n_tokens);
        b.pq_mask.assign((size_t) n_pq*n_tokens, -INFINITY);
        for (int32_t t = 0; t < n_tokens; ++t) {
            const int32_t st = t/n_tps;
            const int32_t r  = t%n_tps;
            for (int32_t j = 0; j < n_seg2; ++j) {
                b.pq_delta[(size_t) t*n_seg2 + j] = b.k2_delta[(size_t) st*n_seg2 + j] + b.q_delta[t] - b.q2_delta[t];
                b.pq_mask[(size_t) t*n_pq + (size_t) r*n_seg2 + j] = b.mask2[(size_t) t*n_seg2 + j];
            }
        }
        set_mask(pq_mask, b.pq_mask.data(), n_pq, 0);
        set_i32(pq_k_delta, b.pq_delta);
    }
}

// whether the inputs of a graph built under cparams fit params: the same settings, and the sizes that follow the
// ubatch and the cells in view
bool llama_attn_extrap_inputs::can_reuse(const llama_cparams & cparams, const llm_graph_params & params,
        const llama_kv_cache_context * mctx) const {
    const auto & ex = params.cparams.attn_extrap;

    bool res = llama_attn_extrap_same_graph(&cparams.attn_extrap, &ex);
    const int64_t n_kv = mctx->get_n_kv();
    res &= ex.mode != LLAMA_ATTN_EXTRAP_CUSTOM || n_stream == extrap_n_stream(params.cparams, params.ubatch);
    res &= !k_delta || k_delta->ne[0] == n_kv*n_stream;
    res &= (k_move_delta ? k_move_delta->ne[0] : 0) == std::max(ex.n_k_move, 0)*n_stream;
    res &= !seg2_mask || seg2_mask->ne[0] == (ex.n_seg2 < 0 ? n_kv : std::min<int64_t>(ex.n_seg2, n_kv));
    res &= !seg2_mask || first_cell == extrap_main_first_cell(ex, n_kv);
    res &= (disp_idxs != nullptr) == extrap_display_cells(params.cparams, params.ubatch, mctx, n_kv);

    return res;
}

// the inputs of stream s: views of its queries' rows and its run of per-cell entries
llama_attn_extrap_inputs llama_attn_extrap_inputs::stream(ggml_context * ctx0, int64_t s) const {
    llama_attn_extrap_inputs r;
    r.first_cell  = first_cell;
    r.seg2_lse    = seg2_lse;
    r.gpu_layouts = gpu_layouts;
    r.view_cell   = view_cell;
    r.fill_failed = fill_failed;

    // n consecutive elements of t from run s (rows of a 2D tensor: rows s*n .. (s + 1)*n - 1)
    auto run = [&](ggml_tensor * t) -> ggml_tensor * {
        if (t == nullptr) {
            return nullptr;
        }
        if (ggml_n_dims(t) == 1) {
            const int64_t n = t->ne[0]/n_stream;
            return ggml_view_1d(ctx0, t, n, s*n*t->nb[0]);
        }
        if (t == q_scale) {  // [1, 1, n_tokens]
            const int64_t n = t->ne[2]/n_stream;
            return ggml_view_3d(ctx0, t, 1, 1, n, t->nb[1], t->nb[2], s*n*t->nb[2]);
        }
        const int64_t n = t->ne[1]/n_stream;  // masks: [n_cols, n_tokens]
        return ggml_view_2d(ctx0, t, t->ne[0], n, t->nb[1], s*n*t->nb[1]);
    };
    r.q_delta      = run(q_delta);
    r.k_delta      = run(k_delta);
    r.q_scale      = run(q_scale);
    r.seg2_mask    = run(seg2_mask);
    r.seg2_q_delta = run(seg2_q_delta);
    r.seg2_k_delta = run(seg2_k_delta);
    r.pq_k_delta   = run(pq_k_delta);
    r.pq_mask      = run(pq_mask);
    r.disp_idxs    = run(disp_idxs);
    r.k_move_gather  = run(k_move_gather);
    r.k_move_scatter = run(k_move_scatter);
    r.k_move_delta   = run(k_move_delta);
    return r;
}

// attention under cparams.attn_extrap (mode CUSTOM)
//   main segment:   Q' = rope(q * q_scale, q_delta), K' = rope(cached K, k_delta) (a copy), kq_mask
//   second segment: Q2 = rope(q * q_scale, seg2_q_delta), K2 = rope(first n_seg2 cached keys, seg2_k_delta)
//                   (the cached keys as they are without use_seg2_k_delta), seg2_mask; the logits of both
//                   segments share one softmax: with flash attention, two calls merged by their log-sum-exps
//                   (CPU), per-query key copies or free cells; else unfused
// The cache is modified only by n_k_move (keys rotated in place first) and by the free cells of disp_idxs. A quantized
// or Hadamard-rotated K is dequantized and rotated back before RoPE.
// The graph budget of mode CUSTOM: what build() adds, and every layer's attention built per stream
uint32_t llama_attn_extrap_graph_objects(int64_t n_layer, int64_t n_stream) {
    const int64_t n = LLAMA_ATTN_EXTRAP_INPUT_OBJECTS + n_layer*std::max<int64_t>(n_stream, 1)*LLAMA_ATTN_EXTRAP_STREAM_OBJECTS;
    return (uint32_t) std::min<int64_t>(n, UINT32_MAX);
}

ggml_tensor * llm_graph_context::build_attn_extrap(
        const llama_kv_cache_context * mctx_cur,
    const llama_attn_extrap_inputs & ex,
                      ggml_tensor * k_rot,
                      ggml_tensor * kq_mask,
                      ggml_tensor * q_raw,
                      ggml_tensor * k,
                      ggml_tensor * v,
                      ggml_tensor * sinks,
                            float   kq_scale,
                              int   il) const {
    // several sequences, one KV stream each: every stream's queries attend to their own stream, as one
    // sequence does; the outputs are stacked in the ubatch's order (stream by stream)
    const int64_t n_stream = k->ne[3];
    GGML_ASSERT(n_stream == ex.n_stream && q_raw->ne[2] % n_stream == 0);
    const int64_t n_tps = q_raw->ne[2]/n_stream;
    ggml_tensor * out = nullptr;
    for (int64_t s = 0; s < n_stream; ++s) {
        const size_t used0 = ggml_used_mem(ctx0);
        ggml_tensor * cur = nullptr;
        if (n_stream == 1) {
            cur = build_attn_extrap_stream(mctx_cur, ex, k_rot, kq_mask, q_raw, k, v, sinks, kq_scale, il);
        } else {
            ggml_tensor * q_s = ggml_view_3d(ctx0, q_raw, q_raw->ne[0], q_raw->ne[1], n_tps, q_raw->nb[1], q_raw->nb[2],
                                             s*n_tps*q_raw->nb[2]);
            ggml_tensor * k_s = ggml_view_4d(ctx0, k, k->ne[0], k->ne[1], k->ne[2], 1, k->nb[1], k->nb[2], k->nb[3], s*k->nb[3]);
            ggml_tensor * v_s = ggml_view_4d(ctx0, v, v->ne[0], v->ne[1], v->ne[2], 1, v->nb[1], v->nb[2], v->nb[3], s*v->nb[3]);
            ggml_tensor * m_s = ggml_view_4d(ctx0, kq_mask, kq_mask->ne[0], kq_mask->ne[1], 1, 1, kq_mask->nb[1],
                                             kq_mask->nb[2], kq_mask->nb[3], s*kq_mask->nb[3]);
            cur = build_attn_extrap_stream(mctx_cur, ex.stream(ctx0, s), k_rot, m_s, q_s, k_s, v_s, sinks, kq_scale, il);
        }
        out = out ? ggml_concat(ctx0, out, cur, 1) : cur;
        // the budget (llama_attn_extrap_graph_objects) holds every stream of every layer to this count; a graph
        // over it is refused whole (the context checks the flag after the build), before its context runs out
        const int64_t n_obj = (int64_t) ((ggml_used_mem(ctx0) - used0)/ggml_tensor_overhead());
        if (n_obj > LLAMA_ATTN_EXTRAP_STREAM_OBJECTS) {
            LLAMA_LOG_ERROR("%s: layer %d, stream %" PRId64 ": the attention took %" PRId64 " graph objects, more than the "
                    "%" PRId64 " its budget allows per stream\n", __func__, il, s, n_obj, LLAMA_ATTN_EXTRAP_STREAM_OBJECTS);
            res->attn_extrap_build_failed = true;
        }
    }
    return out;
}

// one stream's attention: k, v and kq_mask are that stream's views (ne[3] = 1), ex its inputs
ggml_tensor * llm_graph_context::build_attn_extrap_stream(
        const llama_kv_cache_context * mctx_cur,
    const llama_attn_extrap_inputs & ex,
                      ggml_tensor * k_rot,
                      ggml_tensor * kq_mask,
                      ggml_tensor * q_raw,
                      ggml_tensor * k,
                      ggml_tensor * v,
                      ggml_tensor * sinks,
                            float   kq_scale,
                              int   il) const {
    // cached keys as plain RoPE'd vectors
    auto plain_keys = [&](ggml_tensor * kv) {
        ggml_tensor * t = kv;
        // quantized and BF16 caches have no RoPE kernel: rotate an F32 copy
        if (ggml_is_quantized(t->type) || t->type == GGML_TYPE_BF16 || k_rot) {
            t = ggml_cast(ctx0, t, GGML_TYPE_F32);
            if (k_rot) {
                t = llama_mul_mat_hadamard(ctx0, t, k_rot);
            }
        }
        return t;
    };

    if (ex.k_move_delta) {
        // keys rotated in place before this layer's attention reads them (n_k_move): gathered, rotated as the
        // K-shift rotates them (in F32, outside any Hadamard rotation) and written back to their cells; expanded
        // first, so the attention below reads them rotated
        ggml_tensor * rows = ggml_view_2d(ctx0, k, k->ne[0]*k->ne[1], k->ne[2], k->nb[2], 0);  // [n_embd_k_gqa, n_kv]
        ggml_tensor * t = ggml_get_rows(ctx0, rows, ex.k_move_gather);                        // F32
        t = ggml_reshape_3d(ctx0, t, k->ne[0], k->ne[1], t->ne[1]);
        if (k_rot) {
            t = llama_mul_mat_hadamard(ctx0, t, k_rot);
        }
        t = mctx_cur->build_rope_delta(cparams, ctx0, t, ex.k_move_delta, il);
        if (k_rot) {
            t = llama_mul_mat_hadamard(ctx0, t, k_rot);
        }
        t = ggml_reshape_2d(ctx0, t, rows->ne[0], t->ne[2]);
        ggml_build_forward_expand(gf, ggml_set_rows(ctx0, rows, t, ex.k_move_scatter));
    }

    ggml_tensor * q = q_raw;
    if (ex.q_scale) {
        q = ggml_mul(ctx0, q, ex.q_scale);
    }

    ggml_tensor * q_main = ex.q_delta ? mctx_cur->build_rope_delta(cparams, ctx0, q, ex.q_delta, il) : q;
    ggml_tensor * q1 = q_main;
    // the main segment: cells [kv0, n_kv) (kv0 > 0 only beside a second segment); the views start at
    // extrap.view_cell <= kv0, the cells in between masked (aligned offsets outside host memory)
    const bool    kv_first = ex.seg2_mask && ex.first_cell > 0;
    const int64_t kv0      = kv_first ? ex.view_cell : 0;
    ggml_tensor * k1 = kv0 == 0 ? k :
        ggml_view_4d(ctx0, k, k->ne[0], k->ne[1], k->ne[2] - kv0, 1, k->nb[1], k->nb[2], k->nb[3], kv0*k->nb[2]);
    if (ex.k_delta) {
        ggml_tensor * k_delta = kv0 == 0 ? ex.k_delta :
            ggml_view_1d(ctx0, ex.k_delta, k1->ne[2], kv0*ggml_element_size(ex.k_delta));
        ggml_tensor * kp = plain_keys(k1);
        // one segment with flash attention: an F16 key is rotated in F32 and reaches flash attention through
        // the stock F32 -> F16 cast (a copy kernel), never straight from an F16 RoPE (on an H200 that gave
        // wrong attention)
        if (kp->type == GGML_TYPE_F16 && !ex.seg2_mask && cparams.flash_attn) {
            kp = ggml_cast(ctx0, kp, GGML_TYPE_F32);
        }
        k1 = mctx_cur->build_rope_delta(cparams, ctx0, kp, k_delta, il);
    } else if (k_rot) {
        // keys stay as cached (Hadamard space): rotate the queries the same way
        q1 = llama_mul_mat_hadamard(ctx0, q1, k_rot);
    }

    if (!ex.seg2_mask) {
        return build_attn_mha(q1, k1, v, nullptr, kq_mask, sinks, nullptr, 0, kq_scale, il);
    }

    // second segment: the first n_seg2 cells
    const int64_t n_seg2   = ex.seg2_mask->ne[0];
    const int64_t n_tokens = q->ne[2];
    const bool    v_trans  = v->nb[1] > v->nb[2];

    ggml_tensor * k2 = ggml_view_4d(ctx0, k, k->ne[0], k->ne[1], n_seg2, 1, k->nb[1], k->nb[2], k->nb[3], 0);
    // with kv_first both segments use the main query (seg2_q_delta is not read)
    ggml_tensor * q2 = kv_first ? q_main : mctx_cur->build_rope_delta(cparams, ctx0, q, ex.seg2_q_delta, il);
    if (ex.seg2_k_delta) {
        k2 = mctx_cur->build_rope_delta(cparams, ctx0, plain_keys(k2), ex.seg2_k_delta, il);
    } else if (k_rot) {
        // keys as cached (Hadamard space): the query the same way
        q2 = llama_mul_mat_hadamard(ctx0, q2, k_rot);
    }

    const int64_t n_main = k->ne[2] - kv0;

    // cells [cell0, cell0 + n) of V in the flash-attention layout: [head_dim, n_head_kv, n]
    auto v_cells = [&](int64_t cell0, int64_t n) {
        return ggml_view_4d(ctx0, v, v->ne[0], v->ne[1], n, 1, v->nb[1], v->nb[2], v->nb[3], cell0*v->nb[2]);
    };
    ggml_tensor * mask1   = ggml_view_2d(ctx0, kq_mask, n_main, n_tokens, kq_mask->nb[1], kv0*ggml_element_size(kq_mask));

    if (ex.disp_idxs) {
        // one query: the second segment's keys, rotated for it, and its values written into free cells
        // (ex.disp_idxs) before flash attention reads the whole cache view, as stock does
        GGML_ASSERT(kv_first && !k_rot && !v_trans && k->type == GGML_TYPE_F16 && v->type == GGML_TYPE_F16);
        // in host memory the F16 keys are rotated as they are and the F16 values copied straight from their
        // cells (3 nodes per layer: each node of a decoded token costs a thread barrier); elsewhere through F32
        // copies (a GPU's set_rows takes F32 sources; an F16 RoPE output is never handed on there)
        ggml_tensor * kg = ggml_view_4d(ctx0, k, k->ne[0], k->ne[1], n_seg2, 1, k->nb[1], k->nb[2], k->nb[3], 0);
        ggml_tensor * vg = v_cells(0, n_seg2);
        if (ex.gpu_layouts) {
            kg = ggml_cast(ctx0, kg, GGML_TYPE_F32);
            vg = ggml_cast(ctx0, vg, GGML_TYPE_F32);
        }
        if (ex.seg2_k_delta) {
            kg = mctx_cur->build_rope_delta(cparams, ctx0, kg, ex.seg2_k_delta, il);
        }
        ggml_build_forward_expand(gf, mctx_cur->cpy_k(ctx0, kg, ex.disp_idxs, il));
        ggml_build_forward_expand(gf, mctx_cur->cpy_v(ctx0, vg, ex.disp_idxs, il));
        return build_attn_mha(q_main, k, v, nullptr, kq_mask, sinks, nullptr, 0, kq_scale, il);
    }

    if (ex.seg2_lse && !v_trans) {
        // each segment through its own flash-attention call (on the CPU): the main segment's returns its rows'
        // log-sum-exps, and the second segment's call merges its rows with them as it writes them
        // (ggml_flash_attn_ext_merge_lse): o = o1*sigmoid(lse1 - lse2) + o2*sigmoid(lse2 - lse1), the one softmax
        // over both segments (a query with no second-segment key: lse2 = -inf, weights 1 and 0)
        auto fa = [&](ggml_tensor * qs, ggml_tensor * ks, ggml_tensor * vs, ggml_tensor * ms, ggml_tensor * sk,
                      ggml_tensor * prev) {
            qs = ggml_permute(ctx0, qs, 0, 2, 1, 3);
            ks = ggml_permute(ctx0, ks, 0, 2, 1, 3);
            vs = ggml_permute(ctx0, vs, 0, 2, 1, 3);
            if (ks->type == GGML_TYPE_F32) {
                ks = ggml_cast(ctx0, ks, GGML_TYPE_F16);
            }
            if (!ggml_is_contiguous(ms)) {
                ms = ggml_cont(ctx0, ms);   // the main segment's columns of kq_mask (kv_first)
            }
            const float softcap = hparams.attn_soft_cap ? hparams.f_attn_logit_softcapping : 0.0f;
            ggml_tensor * o = prev == nullptr ?
                ggml_flash_attn_ext_lse(ctx0, qs, ks, vs, ms, kq_scale, hparams.f_max_alibi_bias, softcap) :
                ggml_flash_attn_ext    (ctx0, qs, ks, vs, ms, kq_scale, hparams.f_max_alibi_bias, softcap);
            if (prev != nullptr) {
                ggml_flash_attn_ext_merge_lse(o, prev);
            }
            ggml_flash_attn_ext_add_sinks(o, sk);
            ggml_prec_set_acc(o, GGML_PREC_F32);
            return o;   // [head_dim (+ 1: the log-sum-exp, without prev), n_head, n_tokens]
        };
        ggml_tensor * o1 = fa(q1, k1, v_cells(kv0, n_main), mask1, sinks, nullptr);
        cb(o1, "fattn_lse_main", il);
        ggml_tensor * cur = fa(q2, k2, v_cells(0, n_seg2), ex.seg2_mask, nullptr, o1);
        cb(cur, "fattn_merged", il);
        return ggml_reshape_2d(ctx0, cur, cur->ne[0]*cur->ne[1], cur->ne[2]);
    }

    if (ex.pq_mask && !kv_first && !k_rot && !v_trans && k->type == GGML_TYPE_F16 && v->type == GGML_TYPE_F16) {
        // several queries, a short second segment: its keys copied once per query, each copy rotated for its
        // query (row r*n_seg2 + j: key j for query r) and appended to the main segment, its values repeated
        // likewise; the block-diagonal mask lets query r see its own copies only. One flash-attention call
        // over [every cell | n_seg2*n_tokens copies] is then the two-segment attention, exactly
        const int64_t n_pq = n_seg2*n_tokens;
        ggml_tensor * kg = ggml_cast(ctx0, ggml_view_4d(ctx0, k, k->ne[0], k->ne[1], n_seg2, 1, k->nb[1], k->nb[2], k->nb[3], 0),
                                     GGML_TYPE_F32);
        kg = ggml_repeat_4d(ctx0, kg, kg->ne[0], kg->ne[1], n_pq, 1);
        kg = mctx_cur->build_rope_delta(cparams, ctx0, kg, ex.pq_k_delta, il);
        ggml_tensor * vg = ggml_repeat_4d(ctx0, v_cells(0, n_seg2), v->ne[0], v->ne[1], n_pq, 1);
        ggml_tensor * k_main = k1->type == GGML_TYPE_F16 ? k1 : ggml_cast(ctx0, k1, GGML_TYPE_F16);
        ggml_tensor * kcat = ggml_concat(ctx0, k_main, ggml_cast(ctx0, kg, GGML_TYPE_F16), 2);
        ggml_tensor * vcat = ggml_concat(ctx0, v_cells(0, n_main), vg, 2);
        ggml_tensor * mcat = ggml_concat(ctx0, mask1, ex.pq_mask, 0);
        return build_attn_mha(q1, kcat, vcat, nullptr, mcat, sinks, nullptr, 0, kq_scale, il);
    }

    if (kv_first && cparams.flash_attn && !k_rot && !v_trans && k->type == GGML_TYPE_F16 && v->type == GGML_TYPE_F16 &&
            k1->type == GGML_TYPE_F16 && k2->type == GGML_TYPE_F16) {
        // one query, two cell ranges: a single flash-attention call over their concatenation
        // (copies of n_seg2 + n_main cells per layer, read by every query of the ubatch)
        ggml_tensor * kcat = ggml_concat(ctx0, k2, k1, 2);
        ggml_tensor * vcat = ggml_concat(ctx0, v_cells(0, n_seg2), v_cells(kv0, n_main), 2);
        ggml_tensor * mcat = ggml_concat(ctx0, ex.seg2_mask, mask1, 0);
        return build_attn_mha(q1, kcat, vcat, nullptr, mcat, sinks, nullptr, 0, kq_scale, il);
    }

    const int64_t n_head  = q->ne[1];
    const int64_t n_headk = v_trans ? v->ne[2] : v->ne[1];
    const int64_t n_group = n_head / n_headk;

    // With the flash-attention layout (V rows untransposed) and a few queries, ggml_out_prod reads
    // the cached V rows as they are; a transposed copy of V would cost more than the product itself.
    // Only on the CPU: other backends lack OUT_PROD for F16/quantized V.
    bool v_out_prod = false;
    if (!v_trans && n_tokens <= 8) {
        ggml_tensor * vs = v->view_src ? v->view_src : v;
        ggml_backend_buffer_t buf = vs->buffer;
        ggml_backend_dev_t    dev = buf ? ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buf)) : nullptr;
        // the CPU's own buffer type has no device
        v_out_prod = buf && ggml_backend_buffer_is_host(buf) && (!dev || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU);
    }

    // one segment's weighted values: the probabilities of cells [cell0, cell0 + n) sit at column off
    // of kq; the result is [head_dim, n_tokens, n_head]
    auto seg_kqv = [&](ggml_tensor * kq, int64_t cell0, int64_t n, int64_t off) {
        const size_t es = ggml_element_size(kq);
        if (v_out_prod) {
            ggml_tensor * t = ggml_permute(ctx0, v_cells(cell0, n), 0, 2, 1, 3);       // [head_dim, n, n_head_kv]
            if (t->type != GGML_TYPE_F32) {
                t = ggml_cast(ctx0, t, GGML_TYPE_F32);  // once: the F16/quantized out_prod converts a row per query head
            }
            // probabilities as [n_tokens*n_group, n, n_head_kv]: query heads grouped by their KV head
            ggml_tensor * p = ggml_view_4d(ctx0, kq, n, n_tokens, n_group, n_headk,
                                           kq->nb[1], kq->nb[2], kq->nb[2]*n_group, off*es);
            p = ggml_cont(ctx0, ggml_permute(ctx0, p, 2, 0, 1, 3));                   // [n_tokens, n_group, n, n_head_kv]
            p = ggml_reshape_3d(ctx0, p, n_tokens*n_group, n, n_headk);
            ggml_tensor * o = ggml_out_prod(ctx0, t, p);                               // [head_dim, n_tokens*n_group, n_head_kv]
            return ggml_reshape_3d(ctx0, o, o->ne[0], n_tokens, n_head);
        }
        // values as [n, head_dim, n_head_kv] (the transposed layout the non-FA product wants)
        ggml_tensor * t = v_trans ?
            ggml_view_4d(ctx0, v, n, v->ne[1], v->ne[2], 1, v->nb[1], v->nb[2], v->nb[3], cell0*v->nb[0]) :
            v_cells(cell0, n);
        if (v_trans && ex.gpu_layouts && n % 256 != 0) {
            // a transposed V view whose rows are not whole cache views (stock's are n_kv = k*256 cells):
            // Vulkan's mul_mat wrote past its buffers on it (heap corruption under lavapipe); a copy first
            t = ggml_cont(ctx0, t);
        }
        if (ggml_is_quantized(t->type)) {
            t = ggml_cast(ctx0, t, GGML_TYPE_F32);
        }
        t = ggml_permute(ctx0, t, 0, 2, 1, 3);
        if (!v_trans) {
            t = ggml_cont(ctx0, ggml_transpose(ctx0, t));   // [head_dim, n, n_head_kv] -> [n, head_dim, n_head_kv]
        }
        ggml_tensor * p = ggml_cont(ctx0, ggml_view_3d(ctx0, kq, n, kq->ne[1], kq->ne[2], kq->nb[1], kq->nb[2], off*es));
        return ggml_mul_mat(ctx0, t, p);
    };

    ggml_tensor * q1p = ggml_permute(ctx0, q1, 0, 2, 1, 3);
    ggml_tensor * q2p = ggml_permute(ctx0, q2, 0, 2, 1, 3);
    ggml_tensor * k1p = ggml_permute(ctx0, k1, 0, 2, 1, 3);
    ggml_tensor * k2p = ggml_permute(ctx0, k2, 0, 2, 1, 3);

    ggml_tensor * kq1 = ggml_mul_mat(ctx0, k1p, q1p); // [n_main, n_tokens, n_head]
    ggml_tensor * kq2 = ggml_mul_mat(ctx0, k2p, q2p); // [n_seg2, n_tokens, n_head]
    ggml_prec_set_acc(kq1, GGML_PREC_F32);
    ggml_prec_set_acc(kq2, GGML_PREC_F32);

    ggml_tensor * kq   = ggml_concat(ctx0, kq2, kq1, 0);
    ggml_tensor * mask = ggml_concat(ctx0, ex.seg2_mask, mask1, 0);
    if (mask->type != GGML_TYPE_F32) {
        mask = ggml_cast(ctx0, mask, GGML_TYPE_F32);
    }
    cb(kq, "kq_extrap", il);
    // the model's logit caps, as build_attn_mha applies them without flash attention (Grok's, Gemma 2's)
    if (arch == LLM_ARCH_GROK) {
        kq = ggml_tanh(ctx0, ggml_scale(ctx0, kq, hparams.f_attn_out_scale / hparams.f_attn_logit_softcapping));
        kq = ggml_scale(ctx0, kq, hparams.f_attn_logit_softcapping);
    }
    if (hparams.attn_soft_cap) {
        kq = ggml_scale(ctx0, kq, 1.0f / hparams.f_attn_logit_softcapping);
        kq = ggml_tanh (ctx0, kq);
        kq = ggml_scale(ctx0, kq, hparams.f_attn_logit_softcapping);
    }
    kq = ggml_soft_max_ext(ctx0, kq, mask, kq_scale, 0.0f);
    ggml_soft_max_add_sinks(kq, sinks);
    cb(kq, "kq_soft_max_extrap", il);

    ggml_tensor * kqv = ggml_add(ctx0, seg_kqv(kq, kv0, n_main, n_seg2), seg_kqv(kq, 0, n_seg2, 0));

    ggml_tensor * cur = ggml_permute(ctx0, kqv, 0, 2, 1, 3);
    cur = ggml_cont_2d(ctx0, cur, cur->ne[0]*cur->ne[1], cur->ne[2]*cur->ne[3]);

    ggml_build_forward_expand(gf, cur);

    return cur;
}

#pragma once

// farctx: attention extrapolation (llama_set_attn_extrap, mode CUSTOM), the mechanism. The graph inputs live in
// llm_graph_input_attn_kv and, for the non-SWA layers of an iSWA model, llm_graph_input_attn_kv_iswa (member
// `extrap`, over the base cache); the attention graph is llm_graph_context::build_attn_extrap. Both are defined in
// llama-attn-extrap.cpp.

#include "llama.h"

#include "ggml.h"

#include <cstdint>
#include <vector>

struct llama_ubatch;
struct llama_cparams;
struct llm_graph_params;
class  llama_kv_cache_context;

// The graph budget of mode CUSTOM. build_attn_extrap creates at most LLAMA_ATTN_EXTRAP_STREAM_OBJECTS objects
// (tensors and views: one object of the graph context each, and at most one node of the graph) for one stream of
// one layer, over every branch; it counts each stream as it builds it and refuses a graph that takes more
// (llm_graph_result::attn_extrap_build_failed). The inputs (llama_attn_extrap_inputs::build) take at most
// LLAMA_ATTN_EXTRAP_INPUT_OBJECTS
constexpr int64_t LLAMA_ATTN_EXTRAP_STREAM_OBJECTS = 96;
constexpr int64_t LLAMA_ATTN_EXTRAP_INPUT_OBJECTS  = 16;

// the objects mode CUSTOM may add to the stock estimate of a graph of n_layer layers over n_stream KV streams
uint32_t llama_attn_extrap_graph_objects(int64_t n_layer, int64_t n_stream);

// the per-ubatch inputs of the attention graph under mode CUSTOM, filled by cparams.attn_extrap.fill
struct llama_attn_extrap_inputs {
    ggml_tensor * q_delta      = nullptr; // I32 [n_tokens]
    ggml_tensor * k_delta      = nullptr; // I32 [n_kv]
    ggml_tensor * q_scale      = nullptr; // F32 [1, 1, n_tokens]
    ggml_tensor * seg2_mask    = nullptr; // F32/F16 [n_seg2, n_tokens] (type of the kq mask)
    ggml_tensor * seg2_q_delta = nullptr; // I32 [n_tokens]
    ggml_tensor * seg2_k_delta = nullptr; // I32 [n_seg2]
    // the second segment as per-query key copies, for flash attention (several queries, a short second
    // segment, the main segment over every cell): row r*n_seg2 + j is key j rotated for query r
    ggml_tensor * pq_k_delta   = nullptr; // I32 [n_seg2*n_tokens]
    ggml_tensor * pq_mask      = nullptr; // F16 [n_seg2*n_tokens, n_tokens], block-diagonal
    // one query (kv_first) with flash attention: the second segment's keys, rotated for the query, and values
    // are written into free cells of the cache, and one flash-attention call reads the cache view as stock does
    ggml_tensor * disp_idxs    = nullptr; // I64 [n_seg2]: the free cells that receive them
    // keys rotated in place before attention reads the cache (attn_extrap.n_k_move): their cells in the stream's
    // view, twice (get_rows reads I32 indices, set_rows I64), and their rotations
    ggml_tensor * k_move_gather  = nullptr; // I32 [n_k_move]
    ggml_tensor * k_move_scatter = nullptr; // I64 [n_k_move]
    ggml_tensor * k_move_delta   = nullptr; // I32 [n_k_move]
    // several queries with flash attention on the CPU: each segment through its own flash-attention call, which
    // also returns each row's log-sum-exp (ggml_flash_attn_ext_lse), and the two results merged exactly
    bool          seg2_lse     = false;
    int64_t       first_cell   = 0;       // first cell of the main segment (attn_extrap.kv_first if < n_kv)
    // the cache outside host memory: aligned views, short transposed V segments copied contiguous, no
    // log-sum-exp merge
    // env: LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT (=1: these layouts in host memory too; the CPU proxy of a GPU's graph)
    bool          gpu_layouts  = false;
    int64_t       view_cell    = 0;       // first cell of the graph's views: first_cell, or (cache outside host
                                          // memory) first_cell rounded down to 256 cells, [view_cell, first_cell) masked
    // several sequences (one KV stream each, kv_unified = false): the ubatch's queries are n_stream runs of
    // n_tokens/n_stream, one per stream; the per-cell inputs hold n_stream runs (k_delta: n_kv per stream,
    // seg2_k_delta and disp_idxs: n_seg2, pq_k_delta: n_seg2*n_tokens/n_stream) and the callback fills each
    int64_t       n_stream     = 1;

    // host-side buffers of set(). They belong to the graph result (llm_graph_result::attn_extrap_host), which
    // outlives its graphs: a prompt's ubatches, each a new graph, reuse them, and the masks only grow (no
    // allocation and no zeroing of a fresh n_tokens x n_kv mask per ubatch)
    struct host_buffers {
        std::vector<int32_t>     q_pos, kv_pos, q_delta, k_delta, q2_delta, k2_delta;
        std::vector<float>       mask, mask2, q_scale, gap, pq_mask;
        std::vector<int32_t>     pq_delta;
        std::vector<int64_t>     disp, move_row;
        std::vector<int32_t>     move_cell, move_delta;
        std::vector<ggml_fp16_t> tmp16;
    };
    host_buffers * host_bufs = nullptr;

    bool * fill_failed = nullptr; // llm_graph_result::attn_extrap_fill_failed: raised when the callback fails

    // the input tensors for cparams.attn_extrap (none unless mode CUSTOM), beside the attention input's kq_mask
    void build(ggml_context * ctx0, const llama_ubatch & ubatch, const llama_cparams & cparams,
               const llama_kv_cache_context * mctx_cur, const ggml_tensor * kq_mask);

    // per ubatch: the fill callback writes kq_mask, the deltas and the second segment
    void set(const llama_ubatch * ubatch, const llama_cparams & cparams, const llama_kv_cache_context * mctx,
             ggml_tensor * kq_mask);

    // the inputs of stream s as views (host buffers empty): what build_attn_extrap reads for one stream
    llama_attn_extrap_inputs stream(ggml_context * ctx0, int64_t s) const;

    // whether the inputs of a graph built under cparams fit params (llm_graph_input_attn_kv::can_reuse)
    bool can_reuse(const llama_cparams & cparams, const llm_graph_params & params,
                   const llama_kv_cache_context * mctx) const;
};

"""A reproducer of stock llama.cpp defects that farctx's patches fix, through llama-cpp-python's binding alone (no
farctx import: LLAMA_CPP_LIB_PATH picks the library under test). Prints {"diff": max logit difference}; a crash is
the other way to fail. Used by tests/test_upstream_fixes.py (stock against patched, on the CPU) and by
scripts/gpu-check (the F16 K-shift read by flash attention on a GPU, stock and patched).

    LLAMA_CPP_LIB_PATH=build/cmake-stock/bin python tests/upstream_repro.py MODEL CASE [--ngl N]

Cases: seq_div (seq_div over a range against the same positions set cell by cell), yarn_shift, bf16_shift,
q8_0_shift (run with LLAMA_ATTN_ROT_DISABLE=1), f16_shift_fa (a K-shift of the whole cache and the next token by
the same amount keeps every distance: the logits must not change).
"""

from __future__ import annotations

import argparse
import ctypes
import json

import llama_cpp
import numpy as np

N, SHIFT = 48, 12
GGML_TYPE_BF16 = 30  # enum ggml_type; llama_cpp names the others
F32 = dict(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
YARN = dict(rope_scaling_type=llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN, rope_freq_scale=0.5, yarn_ext_factor=1.0,
            yarn_orig_ctx=32, **F32)
SHIFT_CASES = {
    "yarn_shift": YARN,
    "bf16_shift": dict(type_k=GGML_TYPE_BF16, type_v=GGML_TYPE_BF16),
    "q8_0_shift": dict(type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0, flash_attn=True),
    "f16_shift_fa": dict(type_k=llama_cpp.GGML_TYPE_F16, type_v=llama_cpp.GGML_TYPE_F16, flash_attn=True),
}


def next_logits(model: str, tokens: list[int], change=None, **kwargs) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Feed tokens[:N], change the cache, decode tokens[N] right after the last cached position."""
    llm = llama_cpp.Llama(model, n_ctx=128, n_batch=128, logits_all=False, verbose=False, **kwargs)
    llm.eval(tokens[:N])
    mem = llama_cpp.llama_get_memory(llm.ctx)
    if change is not None:
        change(mem)
    one = (ctypes.c_int32 * 1)(tokens[N])
    assert llama_cpp.llama_decode(llm.ctx, llama_cpp.llama_batch_get_one(one, 1)) == 0
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()
    llm.close()
    return logits.astype(np.float64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("case", choices=["seq_div", *SHIFT_CASES])
    ap.add_argument("--ngl", type=int, default=0, help="layers on the GPU (-1: all)")
    args = ap.parse_args()
    tokens = [int(t) for t in np.random.default_rng(31).integers(1, 250, N + 1)]
    gpu = dict(n_gpu_layers=args.ngl)
    if args.case == "seq_div":
        by_div = next_logits(args.model, tokens, lambda mem: llama_cpp.llama_memory_seq_div(mem, 0, 0, N, 2),
                             **F32, **gpu)

        def per_cell(mem) -> None:  # type: ignore[no-untyped-def]
            for p in range(1, N):
                llama_cpp.llama_memory_seq_add(mem, 0, p, p + 1, p // 2 - p)

        diff = np.abs(by_div - next_logits(args.model, tokens, per_cell, **F32, **gpu)).max()
    else:
        kind = {**SHIFT_CASES[args.case], **gpu}
        shifted = next_logits(args.model, tokens, lambda mem: llama_cpp.llama_memory_seq_add(mem, 0, 0, N, SHIFT),
                              **kind)
        diff = np.abs(shifted - next_logits(args.model, tokens, **kind)).max()
    print(json.dumps({"case": args.case, "diff": float(diff)}))


if __name__ == "__main__":
    main()

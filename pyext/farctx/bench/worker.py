"""One benchmark measurement in a process of its own (so stock and patched llama.cpp never share one).

    python -m farctx.bench.worker --method lminf --length 4096 [--stock] [llama options as JSON]

Prints one JSON object: prefill_tps, decode_tps, kv_bytes, rss_bytes. With --stock it runs
llama-cpp-python's own Llama on the unpatched library (LLAMA_CPP_LIB_PATH set by the caller).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def corpus(tokenize, n: int) -> list[int]:
    from farctx.eval.data import NOVELS, austen

    tokens: list[int] = []
    for novel in NOVELS:
        tokens += tokenize(austen(novel).encode("utf-8"))
        if len(tokens) >= n:
            break
    while len(tokens) < n:
        tokens += tokens
    return tokens[:n]


def open_farctx(model: str, method: str, length: int, n_gen: int, kwargs: dict):
    """farctx.Llama for one measurement: the plan's cache for a stream of length + n_gen tokens (the methods that
    keep the whole stream, vanilla too; fixed-cache methods size their own)."""
    import farctx

    return farctx.Llama(model, method=method, n_prompt=length, n_predict=n_gen, **kwargs)


def open_stock(model: str, kwargs: dict):
    """llama-cpp-python's Llama on the stock library; with rpc_servers, its layers on those servers as
    farctx.Llama puts them (the stock library's own RPC backend)."""
    import llama_cpp

    servers = kwargs.pop("rpc_servers", None)
    if not servers:
        return llama_cpp.Llama(model_path=model, **kwargs)
    import ctypes
    import os

    from farctx import rpc

    ggml = ctypes.CDLL(os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libggml.so"))

    class StockOnRpc(llama_cpp.Llama):
        model_params = rpc.model_params_property()
        _model_devices = rpc.model_devices(rpc.parse_servers(servers), ggml)

    return StockOnRpc(model_path=model, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--method", default="vanilla")
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--stock", action="store_true")
    ap.add_argument("--kwargs", default="{}", help="llama keyword arguments as JSON")
    args = ap.parse_args()
    kwargs = json.loads(args.kwargs)
    kwargs.setdefault("verbose", False)

    if args.stock:
        kwargs["n_ctx"] = args.length + args.n_gen
        llm = open_stock(args.model, kwargs)
    else:
        llm = open_farctx(args.model, args.method, args.length, args.n_gen, kwargs)

    tokens = corpus(lambda b: llm.tokenize(b, add_bos=False), args.length + args.n_gen)
    start = time.perf_counter()
    llm.eval(tokens[: args.length])
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for t in tokens[args.length : args.length + args.n_gen]:
        llm.eval([t])
    decode = time.perf_counter() - start
    kv_bytes = None if args.stock else llm.stats()["kv_bytes"]  # stock has no KV-size API
    result = {
        "prefill_tps": args.length / prefill,
        "decode_tps": args.n_gen / decode if args.n_gen else None,
        "kv_bytes": kv_bytes,
        "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "n_ctx": llm.n_ctx(),
    }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()

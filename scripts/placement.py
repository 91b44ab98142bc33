#!/usr/bin/env python3
# Used by scripts/gpu-check (GPU_CHECK_DEVICE=CUDA) and scripts/vulkan-check (Vulkan): FARCTX_ROOT=<repo>
# GPU_CHECK_DEVICE=<backend name as GGML_SCHED_DEBUG prints it, 5 characters: CUDA0, Vulka> GGML_SCHED_DEBUG=2 scripts/placement.py <work folder>
"""Where the scheduler puts each node, every method x K/V configuration, all layers on the GPU."""
import collections, contextlib, io, os, re, sys
sys.path.insert(0, os.path.join(os.environ["FARCTX_ROOT"], "tests"))
import farctx
from helpers import KV_CONFIGS, kv_id, random_tokens
from tiny_gguf import TinyConfig, write_tiny_gguf

work = sys.argv[1]
model = write_tiny_gguf(os.path.join(work, "tiny.gguf"), farctx.default_model_path(), TinyConfig())
# every method of the table, past n_local (32): second segments, stairs and groups are all in use
PARAMS = {"mesa": dict(first_chunk=4, stair_width=2, last_context=8, gen_budget=2)}
METHODS = {m: PARAMS.get(m, {}) for m in farctx.METHODS}
node = re.compile(r"node #\s*\d+ \(\s*([A-Z_0-9]+)\):\s+(\S+) \(.*?\) \[\s*(\S+)")
tokens = random_tokens(100, seed=5)
if os.environ.get("GPU_CHECK_PLACEMENT_METHODS"):
    METHODS = {m: METHODS[m] for m in os.environ["GPU_CHECK_PLACEMENT_METHODS"].split(",")}
base = {}  # kv configuration -> CPU nodes of the stock graph (vanilla runs first)
bad = 0
for method, params in METHODS.items():
    for kv in KV_CONFIGS:
        type_k, type_v, fa = kv
        buf = io.StringIO()
        err = ""
        with contextlib.redirect_stderr(buf):
            try:
                llm = farctx.Llama(str(model), method=method, n_ctx=256, n_batch=16, n_ubatch=16, type_k=type_k,
                                   type_v=type_v, flash_attn=fa, n_gpu_layers=-1, verbose=True, **params)
                llm.eval(tokens[:96])
                for t in tokens[96:]:
                    llm.eval([t])
                llm.close()
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"
        on_cpu = collections.Counter()
        n_nodes = 0
        for op, name, backend in node.findall(buf.getvalue()):
            n_nodes += 1
            if not backend.startswith(os.environ["GPU_CHECK_DEVICE"]):
                on_cpu[(op, re.sub(r"-\d+$", "", name), backend)] += 1
        splits = len(re.findall(r"## SPLIT #", buf.getvalue()))
        cpu_ops = {k for k in on_cpu}
        if method == "vanilla":
            base[kv] = cpu_ops
        extra = sorted(cpu_ops - base.get(kv, set()))
        status = "ERROR " + err if err else ("ok" if n_nodes and not extra else ("NO NODES SEEN" if not n_nodes else "CPU FALLBACK"))
        if status != "ok":
            bad += 1
        print(f"{method:<12} {kv_id(kv):<20} {status:<14} nodes {n_nodes:>6}, splits {splits:>4}, "
              f"on CPU: {', '.join(f'{o}:{n}' for o, n, b in sorted(cpu_ops)) or '-'}"
              + (f"  << not in stock: {', '.join(f'{o}:{n}' for o, n, b in extra)}" if extra else ""), flush=True)
print(f"\n{bad} configuration(s) with nodes off the GPU beyond the stock graph's, or errors")
sys.exit(1 if bad else 0)

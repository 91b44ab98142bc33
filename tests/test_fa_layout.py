"""What our graphs hand to flash attention, checked on the CPU against what stock llama.cpp hands it.

Every flash-attention node that llama.cpp computes is read through its evaluation callback (`cb_eval`,
farctx.eval.tensor_probe.FlashAttnLayouts: type, shape, strides, view offset, and what owns the memory of Q, K,
V and the mask). A GPU kernel
may accept fewer layouts than the CPU one, and on an H200 mesa went wrong with flash attention
while the CPU was exact (bench/results/gpu/README.md). So every node of ours must be one of:
  - K and V: the KV-cache view exactly as stock builds it (same type, shape, strides, offset 0), or a
    fresh tensor written by a copy kernel (CPY: a cast; CONCAT: two cell ranges joined), whole (offset 0);
    never the output of any other op (an F16 RoPE straight into flash attention is what failed);
  - Q: F32 from the model's RoPE or the Hadamard product of a quantized cache (stock), or from our query
    scale or rotation (MUL, ROPE);
  - mask: F16, as wide as K, the stock input tensor or a CONCAT of two masks.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import F16, F32, Q8_0, engine_logits, gpu_layers, random_tokens

from farctx.eval.tensor_probe import FlashAttnLayouts, FlashAttnNode, Operand, eval_callback_installed

N_LOCAL, N_GLOBAL, N_SINK = 32, 10, 4
MESA = dict(first_chunk=4, stair_width=2, last_context=8, gen_budget=2)
METHOD_KWARGS: dict[str, dict[str, int]] = {
    "vanilla": {},
    "lminf": dict(n_local=N_LOCAL, n_global=N_GLOBAL),
    "window": dict(n_local=N_LOCAL),
    "lambda-only": dict(n_local=N_LOCAL, n_global=N_GLOBAL),
    "streaming": dict(n_local=N_LOCAL - N_SINK, n_sink=N_SINK),
    "rerope": dict(n_local=N_LOCAL),
    "mesa": MESA,
    "selfextend": dict(group=4, neighbor=8),
    "dca": dict(chunk_size=12, local_window=4),
    "string": dict(shifted_offset=12, local_value=4),
    "auto": dict(chunk_size=12, local_window=4),
}
KV = {"f16": (F16, F16), "q8_0": (Q8_0, Q8_0), "f32": (F32, F32)}


def fa_nodes(tiny_model: Path, method: str, kv: str, n_ubatch: int) -> list[FlashAttnNode]:
    """The flash-attention nodes of a 100-token prompt and 30 decoded tokens (past the tiny model's
    trained context of 32: every method leaves the stock graph)."""
    type_k, type_v = KV[kv]
    probe = FlashAttnLayouts()
    with eval_callback_installed(probe):
        engine_logits(tiny_model, random_tokens(130, seed=5), 100, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                      flash_attn=True, method=method, n_ctx=256, **METHOD_KWARGS[method])
    probe.check()
    assert probe.nodes, "no flash-attention node was computed"
    return probe.nodes


def layout_violations(nodes: list[FlashAttnNode], stock_cache: dict[str, set[tuple[object, ...]]]) -> Iterator[str]:
    # the log-sum-exp calls run on the CPU only (ggml_backend_dev_supports_op refuses them elsewhere)
    for node in (n for n in nodes if not n.lse):
        k, v, q, mask = node.ops["k"], node.ops["v"], node.ops["q"], node.ops["mask"]
        for name, op in (("k", k), ("v", v)):
            if op.origin == "cache":
                if op.layout not in stock_cache[name]:
                    yield f"{name}: a cache view stock never builds: {op}"
            elif op.origin in ("CPY", "CONCAT"):
                if not op.whole:
                    yield f"{name}: part of a {op.origin} output: {op}"
            else:
                yield f"{name}: written by {op.origin}, not by a copy kernel: {op}"
        # the model's RoPE, our scale or rotation, or (quantized K, as stock) the Hadamard product
        if q.type != "f32" or q.origin not in ("ROPE", "MUL", "MUL_MAT") or q.nb[0] != 4:
            yield f"q: {q}"
        if mask.type != "f16" or mask.origin not in ("input", "CONCAT") or mask.ne[0] != k.ne[1] or not mask.whole:
            yield f"mask: {mask} for K {k.ne}"


@pytest.fixture(scope="module")
def stock_layouts(tiny_model: Path) -> dict[str, dict[str, set]]:
    """The K and V cache views of stock llama.cpp's graph (vanilla runs it), per cache type."""
    out = {}
    for kv in KV:
        nodes = [n for ub in (1, 7) for n in fa_nodes(tiny_model, "vanilla", kv, ub)]
        out[kv] = {name: {n.ops[name].layout for n in nodes} for name in ("k", "v")}
    return out


@pytest.mark.parametrize("n_ubatch", [1, 7])
@pytest.mark.parametrize("kv", list(KV))
@pytest.mark.parametrize("method", [m for m in METHOD_KWARGS if m != "vanilla"])
def test_flash_attention_layouts_are_stock_or_copies(tiny_model, stock_layouts, method, kv, n_ubatch):
    nodes = fa_nodes(tiny_model, method, kv, n_ubatch)
    problems = sorted(set(layout_violations(nodes, stock_layouts[kv])))
    assert not problems, f"{method} {kv} ubatch {n_ubatch}:\n" + "\n".join(problems)


# LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT=1: the graphs a cache outside host memory gets (a GPU's), built on the CPU
DEVICE_LAYOUT = {"LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT": "1"}


def _fa_nodes_in_child(tiny_model: Path, tmp_path: Path, method: str, env: dict[str, str]) -> list[FlashAttnNode]:
    """fa_nodes(method, f16, ubatch 7) in a child process (the library reads its switches once per process)."""
    out = tmp_path / f"{method}-nodes.pickle"
    code = (f"import pickle, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from pathlib import Path; "
            f"import test_fa_layout as t; nodes = t.fa_nodes(Path({str(tiny_model)!r}), {method!r}, 'f16', 7); "
            f"open({str(out)!r}, 'wb').write(pickle.dumps(nodes))")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, **env))
    return pickle.loads(out.read_bytes())


def test_the_check_can_fail(tiny_model, stock_layouts):
    """An F16 RoPE output handed straight to flash attention (what gave wrong attention on an H200), a cache view
    stock never builds, part of a copy, and a mask of the wrong type are each flagged; mesa's last chunk really
    takes the F32 rotation and a cast (CPY) and passes."""
    fixed = fa_nodes(tiny_model, "mesa", "f16", 7)
    rotated = [n for n in fixed if n.ops["k"].origin == "CPY"]
    assert rotated and not list(layout_violations(fixed, stock_layouts["f16"]))
    good = rotated[0]
    k = good.ops["k"]
    bad = {
        "written by ROPE": {**good.ops, "k": Operand(k.type, k.ne, k.nb, k.offs, "ROPE", k.base_ne)},
        "a cache view stock never builds": {**good.ops, "k": Operand(k.type, k.ne, k.nb, 64, "cache", k.base_ne)},
        "part of a CPY output": {**good.ops, "v": Operand(k.type, k.ne, k.nb, 64, "CPY", k.base_ne)},
        "mask": {**good.ops, "mask": Operand("f32", *list(good.ops["mask"].layout)[1:], "input",
                                             good.ops["mask"].base_ne)},
    }
    for what, ops in bad.items():
        problems = list(layout_violations([FlashAttnNode(ops)], stock_layouts["f16"]))
        assert any(what in p for p in problems), (what, problems)


def test_aligned_views_match_the_oracle():
    """Outside host memory (a GPU cache) the main segment's views start at a cell rounded down to 256
    (Vulkan asserts on a misaligned view offset: a transposed V or a mask column view at cell kv_first),
    with the cells in between masked, and no segment merges by log-sum-exp. LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT=1
    takes those paths on the CPU: the kv_first methods (lminf and streaming decoding, mesa's middle chunks
    through the concatenation of both cell ranges) must still equal the oracle, and so must dca, whose prompt
    ubatches of 64 read a rotated copy through the two-segment softmax there."""
    here = Path(__file__).parent
    tests = [str(here / "test_oracle_methods.py"), str(here / "test_oracle_mesa.py"), str(here / "test_oracle_dca.py")]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests,
                          "-k", "(lminf or streaming) and -1] or mesa_matches and -7] or dca_matches and -64]"],
                         env=dict(os.environ, **DEVICE_LAYOUT), capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


def _per_query_nodes(nodes: list[FlashAttnNode], n_seg2: int) -> list[FlashAttnNode]:
    return [n for n in nodes if n.ops["q"].ne[1] == 7 and n.ops["k"].ne[1] == 256 + 7 * n_seg2]


@pytest.mark.skipif(gpu_layers() != 0, reason="the log-sum-exp path is the CPU's (the cache in host memory); a GPU "
                                             "cache takes the per-query copies, checked below")
@pytest.mark.parametrize("method, n_seg2", [("lminf", N_GLOBAL), ("streaming", N_SINK)])
def test_prefill_past_n_local_merges_two_flash_attentions(tiny_model, tmp_path, method, n_seg2):
    """On the CPU, a ubatch of 7 queries past n_local: the cells and the head tokens (globals, sinks) each go
    through a flash-attention call that also returns its rows' log-sum-exp, and the two are merged inside the
    second call's kernel: no copies, no two-segment softmax, no per-query key copies. The device layout takes
    no such node."""
    nodes = [n for n in fa_nodes(tiny_model, method, "f16", 7) if n.ops["q"].ne[1] == 7]
    lse = [n for n in nodes if n.lse]
    main = [n for n in lse if n.ops["k"].ne[1] >= 256 - N_GLOBAL]   # every cell, or those from kv_first on
    head = [n for n in lse if n.ops["k"].ne[1] == n_seg2]   # the merging call (it reads the first one's lse)
    # two ubatches of the 100-token prompt lie wholly past n_local = 32, two layers: a pair per layer and ubatch
    assert len(main) >= 2 * 2 and len(head) == len(main) and len(lse) == len(main) + len(head)
    assert all(n.ops["mask"].ne[0] == n.ops["k"].ne[1] for n in lse)
    assert not _per_query_nodes(nodes, n_seg2)
    device = _fa_nodes_in_child(tiny_model, tmp_path, method, DEVICE_LAYOUT)
    assert not any(n.lse for n in device)


@pytest.mark.parametrize("method, n_seg2", [("streaming", N_SINK), ("lminf", N_GLOBAL)])
def test_prefill_past_n_local_goes_through_flash_attention(tiny_model, tmp_path, method, n_seg2):
    """Where the log-sum-exp is not at hand (a GPU cache; on the CPU LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT=1), a ubatch
    of 7 queries past n_local: the head tokens (globals, sinks) are copied once per query, each copy rotated for
    its query, and appended to the cells, so one flash-attention call over [256 cells | 7 * n_seg2 copies]
    computes the whole attention (no two-segment softmax). Its nodes follow the layout rules above."""
    nodes = _fa_nodes_in_child(tiny_model, tmp_path, method, DEVICE_LAYOUT)
    per_query = _per_query_nodes(nodes, n_seg2)
    assert per_query and all(n.ops["k"].origin == "CONCAT" and n.ops["mask"].origin == "CONCAT" for n in per_query)
    # two ubatches of the 100-token prompt lie wholly past n_local = 32 (tokens 35-41 and 42-48, ...), per layer
    assert len(per_query) >= 2 * 2
    assert not list(layout_violations(per_query, {"k": set(), "v": set()}))


def test_lminf_per_query_copies_match_the_oracle():
    """The per-query copies of a GPU cache, on the CPU (LLAMA_ATTN_EXTRAP_DEVICE_LAYOUT=1): lminf's oracle suite
    with flash attention, F16 and Q8_0 caches, ubatch 1/7/64."""
    here = Path(__file__).parent
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(here / "test_oracle_methods.py"), "-k", "lminf and faon"],
                         env=dict(os.environ, **DEVICE_LAYOUT), capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


@pytest.mark.parametrize("method", ["lminf", "streaming"])
def test_decode_past_n_local_reads_the_cache_view(tiny_model, method):
    """One query past n_local with an F16 cache: the head tokens' keys, rotated for the query, and their values
    are written into free cells of the cache, and flash attention reads the cache view exactly as stock
    builds it (no copy of the cells: decoding at the speed of a window)."""
    nodes = [n for n in fa_nodes(tiny_model, method, "f16", 7) if n.ops["q"].ne[1] == 1]
    assert nodes and all(n.ops["k"].origin == "cache" and n.ops["v"].origin == "cache" for n in nodes)
    assert all(n.ops["mask"].origin == "input" for n in nodes)

"""The context plan (libfarctx's farctx_context_plan, farctx.methods.context_plan): the one decider of a stream's
cells, the batch sizes in force and the window. Its rules over a table of cases, and the surfaces that ask it
(farctx.Llama, farctx generate, farctx serve) giving the same cells and window, or the same refusal, for the same
model, method and flags."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from helpers import free_port, run_cli, running_server

import farctx
from farctx.methods import MethodParams, context_plan


def plan(method: str, n_ctx_train: int = 8192, **sizes: Any) -> Any:
    params = {k: sizes.pop(k) for k in list(sizes) if k in MethodParams.names()}
    return context_plan(MethodParams.from_kwargs(method, params), n_ctx_train, **sizes)


def test_fixed_cache_sizes_itself_without_c():
    p = plan("lminf", n_local=24, n_global=4)
    assert (p.n_ctx_seq, p.n_ubatch, p.n_local, p.window_fitted) == (4 + 24 + 512, 512, 24, False)
    # on sliding-window layers: at least the window + a ubatch
    assert plan("lminf", n_local=24, n_global=4, n_swa=1024).n_ctx_seq == 1024 + 512


def test_small_c_clamps_the_batches_and_fits_an_unset_ubatch():
    """-c 128 with a 24-token window: llama.cpp's cache of 256 cells, n_batch clamped to it, the ubatch the room
    head + n_local leave (the case every surface used to size differently)."""
    p = plan("lminf", n_local=24, n_global=4, n_ctx=128)
    assert (p.n_ctx, p.n_ctx_seq, p.n_batch, p.n_ubatch, p.n_local) == (128, 256, 256, 256 - 28, 24)
    with pytest.raises(farctx.FarctxError, match="lminf needs 284 KV cells: n_global \\+ n_local \\+ n_ubatch = "
                       "4 \\+ 24 \\+ 256; the KV cache holds 256"):
        plan("lminf", n_local=24, n_global=4, n_ctx=128, n_ubatch=512)  # a ubatch set is kept (clamped to n_batch)


def test_an_unset_window_is_fitted_to_a_budget():
    p = plan("lminf", n_ctx=2048)
    assert (p.n_ubatch, p.n_local, p.window_fitted) == (512, 2048 - 10 - 512, True)
    p = plan("lminf", n_ctx=1024)  # the default ubatch would leave the window under half: a quarter of the cache
    assert (p.n_ubatch, p.n_local, p.window_fitted) == (256, 1024 - 10 - 256, True)
    with pytest.raises(farctx.FarctxError, match="lminf needs 330 KV cells: n_global \\+ n_local \\+ n_ubatch = 10 "
                       "\\+ 64 \\(the smallest window fitted to a cache; the default is 8192\\) \\+ 256"):
        plan("lminf", n_ctx=256, n_ubatch=256)


def test_several_streams_share_c():
    p = plan("lminf", n_ctx=2048, n_seq=2)
    assert (p.n_ctx, p.n_ctx_seq, p.n_local) == (2048, 1024, 1024 - 10 - 256)
    with pytest.raises(farctx.FarctxError, match="needs 326 KV cells per stream \\(300 cells / 2 streams\\)"):
        plan("lminf", n_local=300, n_ubatch=16, n_ctx=300, n_seq=2)
    with pytest.raises(farctx.FarctxError, match="sliding-window layers need their window \\+ n_ubatch = 600 \\+ 64"):
        plan("lminf", n_local=100, n_ubatch=64, n_ctx=512, n_swa=600)


def test_whole_stream_methods():
    assert plan("dca").n_ctx_seq == 4 * 8192
    assert plan("vanilla").n_ctx_seq == 8192
    assert plan("dca", n_prompt=1000, n_predict=24).n_ctx_seq == 1024
    p = plan("dca", n_ctx=3000, n_seq=2)
    assert (p.n_ctx_seq, p.n_local) == (1536, 0)


# (flags as the CLI takes them, what every surface reports: (cells per stream, n_local) or the refusal)
CASES = [
    (["--method", "lminf", "--n-local", "24", "--n-global", "4", "-c", "128"], (256, 24)),
    (["--method", "lminf", "-c", "128"], (256, 32)),  # n_local unset: the tiny model's default window fits
    (["--method", "streaming", "--n-sink", "2", "-c", "300", "-ub", "32"], (512, 30)),
    (["--method", "dca", "-c", "256"], (256, 0)),
    (["--method", "lminf", "--n-local", "600", "-ub", "16", "-c", "300"],
     "lminf needs 626 KV cells: n_global + n_local + n_ubatch = 10 + 600 + 16; the KV cache holds 512"),
]


def _kwargs(flags: list[str]) -> dict[str, Any]:
    names = {"--method": "method", "-c": "n_ctx", "-ub": "n_ubatch"}
    pairs = dict(zip(flags[::2], flags[1::2]))
    return {names.get(k, k[2:].replace("-", "_")): (v if k == "--method" else int(v)) for k, v in pairs.items()}


def _llama(model: str, flags: list[str]) -> Any:
    try:
        with farctx.Llama(model, **_kwargs(flags)) as llm:
            stats = llm.stats()
            return stats["n_ctx"], stats["n_local"]
    except farctx.FarctxError as exc:
        return str(exc)


def _generate(model: str, flags: list[str]) -> Any:
    result = run_cli("generate", "-m", model, *flags, "-p", "Hello", "-n", "1", "--temp", "0", "--json")
    if result.returncode != 0:
        return result.stderr
    stats = json.loads(result.stdout)["stats"]
    return stats["n_ctx"], stats["n_local"]


def _serve(model: str, flags: list[str], tmp_path: Any) -> Any:
    port = free_port()
    args = ["-m", model, "--port", str(port), "--log-level", "warning", *flags]
    try:
        with running_server(args, tmp_path / f"serve-{port}.log", f"http://127.0.0.1:{port}") as base:
            meta = httpx.get(f"{base}/v1/models").json()["data"][0]["meta"]
            return meta["n_ctx"], meta["params"].get("n_local", 0) if meta["method"] != "dca" else 0
    except pytest.fail.Exception as exc:  # refused at start: running_server fails with the server's output
        return str(exc)


@pytest.mark.parametrize("flags,expected", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_every_surface_gets_the_same_plan(tiny_model, tmp_path, flags, expected):
    model = str(tiny_model)
    got = {"farctx.Llama": _llama(model, flags), "farctx generate": _generate(model, flags),
           "farctx serve": _serve(model, flags, tmp_path)}
    for surface, answer in got.items():
        if isinstance(expected, str):
            assert isinstance(answer, str) and expected in answer, (surface, answer)
        else:
            assert answer == expected, (surface, answer)

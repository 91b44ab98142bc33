"""The context plan (libfarctx's farctx_context_plan, farctx.methods.context_plan): the one decider of a stream's
cells, the batch sizes in force and the window. Its rules over a table of cases, and every surface that makes a
context (farctx.Llama, farctx generate, chat, eval and serve, the llm plugin, the server's planned SequenceBatch)
giving the same cells and window, or the same refusal, for the same model, method and flags."""

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
    assert (p.n_ctx, p.n_ctx_seq, p.n_ubatch, p.n_local, p.window_fitted) == (4 + 24 + 512, 768, 512, 24, False)
    # on sliding-window layers: at least the window + a ubatch
    assert plan("lminf", n_local=24, n_global=4, n_swa=1024).n_ctx == 1024 + 512


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
    assert plan("auto").n_ctx_seq == 8192  # sized as stock: -c past the trained context reads past it
    assert plan("auto", n_prompt=16000, n_predict=128).n_ctx_seq == 16128
    assert plan("dca", n_prompt=1000, n_predict=24).n_ctx_seq == 1024
    p = plan("dca", n_ctx=3000, n_seq=2)
    assert (p.n_ctx_seq, p.n_local) == (1536, 0)


# (model, flags as the CLI takes them, what every surface reports: (cells per stream, n_local) or the refusal).
# Heads are given: `farctx chat` sets an unset head to its template's (docs/cli.md).
CASES = [
    ("tiny", ["--method", "lminf", "--n-local", "24", "--n-global", "4", "-c", "128"], (256, 24)),
    ("tiny", ["--method", "lminf", "--n-global", "4", "-c", "128"], (256, 32)),  # fitted; the default window fits
    # the default window (n_ctx_train) fitted to a budget: 1024 - 4 - a quarter of the cache
    ("tiny", ["--method", "lminf", "--n-global", "4", "--n-ctx-train", "2048", "-c", "1024"], (1024, 764)),
    ("tiny", ["--method", "lminf", "--n-local", "24", "--n-global", "4"], (768, 24)),  # no -c: 4 + 24 + 512 cells
    ("tiny", ["--method", "streaming", "--n-sink", "2", "-c", "300", "-ub", "32"], (512, 30)),
    ("tiny", ["--method", "dca", "-c", "256"], (256, 0)),  # a whole-stream method in the caller's cache
    ("tiny", ["-c", "256"], (256, 0)),  # the default, auto: the caller's cache
    ("tiny", ["--method", "lminf", "--n-local", "600", "--n-global", "10", "-ub", "16", "-c", "300"],
     "lminf needs 626 KV cells: n_global + n_local + n_ubatch = 10 + 600 + 16; the KV cache holds 512"),
    ("tiny", ["--method", "lminf", "--n-global", "4", "--n-ctx-train", "2048", "-c", "1024", "-np", "2"],
     (512, 380)),  # the slots share -c
    ("iswa", ["--method", "lminf", "--n-local", "4", "--n-global", "2", "-c", "512", "-ub", "64"], (512, 4)),
    ("iswa", ["--method", "lminf", "--n-local", "4", "--n-global", "2", "-c", "256", "-ub", "250", "-b", "250"],
     "sliding-window layers need their window + n_ubatch = 8 + 250"),
]
SLOTS = "-np"


def _pairs(flags: list[str]) -> dict[str, str]:
    return dict(zip(flags[::2], flags[1::2]))


def _kwargs(flags: list[str]) -> dict[str, Any]:
    """farctx.Llama's keyword arguments for the flags (-np aside)."""
    names = {"--method": "method", "-c": "n_ctx", "-b": "n_batch", "-ub": "n_ubatch"}
    return {names.get(k, k[2:].replace("-", "_")): (v if k == "--method" else int(v))
            for k, v in _pairs(flags).items() if k != SLOTS}


def _reported(text: str) -> Any:
    """(cells, n_local) from the line a command prints at start ("farctx: lminf (n_global 4, n_local 24), cache
    256 cells"), else its output (the refusal)."""
    import re

    m = re.search(r"farctx: [\w-]+[^(\n]* \(([^)]*)\), cache (\d+) cells", text)
    if m is None:
        return text
    local = re.search(r"n_local (\d+)", m.group(1))
    return int(m.group(2)), int(local.group(1)) if local else 0


def _llama(model: str, flags: list[str], tmp_path: Any) -> Any:
    try:
        with farctx.Llama(model, **_kwargs(flags)) as llm:
            stats = llm.stats()
            return stats["n_ctx"], stats["n_local"] if llm.method_params.method != "dca" else 0
    except farctx.FarctxError as exc:
        return str(exc)


def _generate(model: str, flags: list[str], tmp_path: Any) -> Any:
    result = run_cli("generate", "-m", model, *flags, "-p", "Hello", "-n", "1", "--temp", "0", "--json")
    if result.returncode != 0:
        return result.stderr
    stats = json.loads(result.stdout)["stats"]
    return stats["n_ctx"], stats["n_local"] if _pairs(flags).get("--method") != "dca" else 0


def _chat(model: str, flags: list[str], tmp_path: Any) -> Any:
    result = run_cli("chat", "-m", model, *flags, stdin="")  # end of input: the chat ends after loading
    return _reported(result.stderr)


def _eval(model: str, flags: list[str], tmp_path: Any) -> Any:
    text = tmp_path / "text.txt"
    text.write_text(" ".join(["the cat sat on the mat and looked at the door"] * 40))
    flags = ["--methods" if f == "--method" else f for f in flags]
    result = run_cli("eval", "ppl", "-m", model, "-f", str(text), "--lengths", "48", "--window", "8", *flags)
    return _reported(result.stderr)


def _llm_plugin(model: str, flags: list[str], tmp_path: Any) -> Any:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "llm-farctx"))
    import llm_farctx

    plugin = llm_farctx.FarctxModel("table", model)
    try:
        options = llm_farctx.FarctxModel.Options(**_kwargs(flags))  # llm's -o options, checked as llm checks them
        llm = plugin._engine({k: v for k, v in options.model_dump().items() if v is not None}, 0, 0)
        stats = llm.stats()
        llm.close()
        return stats["n_ctx"], stats["n_local"] if llm.method_params.method != "dca" else 0
    except farctx.FarctxError as exc:
        return str(exc)


def _slots(model: str, flags: list[str], tmp_path: Any) -> Any:
    """SequenceBatch on the plan of -np streams, as the server makes its slots."""
    from farctx.batch import SequenceBatch
    from farctx.context import LoadedModel, RuntimeOptions

    kwargs = _kwargs(flags)
    params = farctx.MethodParams.from_kwargs(kwargs.pop("method"), {k: kwargs.pop(k) for k in list(kwargs)
                                                                    if k in MethodParams.names()})
    n_seq = int(_pairs(flags)[SLOTS])
    model_ = LoadedModel(model, RuntimeOptions(**kwargs))
    try:
        plan = model_.plan(params, n_seq=n_seq)
    except farctx.FarctxError as exc:
        model_.close()
        return str(exc)
    with SequenceBatch.planned(model_, plan, n_seq) as batch:
        batch.open(0, params.method, **params.relevant())
        return batch.n_ctx_seq, batch.stats(0)["n_local"]


def _serve(model: str, flags: list[str], tmp_path: Any) -> Any:
    port = free_port()
    args = ["-m", model, "--port", str(port), "--log-level", "warning", *flags]
    try:
        with running_server(args, tmp_path / f"serve-{port}.log", f"http://127.0.0.1:{port}") as base:
            meta = httpx.get(f"{base}/v1/models").json()["data"][0]["meta"]
            return meta["n_ctx"], meta["params"].get("n_local", 0) if meta["method"] != "dca" else 0
    except pytest.fail.Exception as exc:  # refused at start: running_server fails with the server's output
        return str(exc)


# every surface that makes a context; the ones without slots answer the rows without -np
SURFACES = {"farctx.Llama": _llama, "farctx generate": _generate, "farctx chat": _chat, "farctx eval": _eval,
            "llm plugin": _llm_plugin, "farctx serve": _serve}
SLOT_SURFACES = {"SequenceBatch (planned)": _slots, "farctx serve": _serve}


@pytest.fixture(scope="module")
def table_models(tiny_model, tmp_path_factory, default_model) -> dict[str, str]:
    from tiny_gguf import FAMILIES_ISWA, write_tiny_gguf

    iswa = write_tiny_gguf(tmp_path_factory.mktemp("plan-iswa") / "gemma3.gguf", default_model, FAMILIES_ISWA["gemma3"])
    return {"tiny": str(tiny_model), "iswa": str(iswa)}


@pytest.mark.parametrize("model,flags,expected", CASES, ids=[f"{c[0]}: " + " ".join(c[1]) for c in CASES])
def test_every_surface_gets_the_same_plan(table_models, tmp_path, model, flags, expected):
    surfaces = SLOT_SURFACES if SLOTS in flags else SURFACES
    got = {name: surface(table_models[model], flags, tmp_path) for name, surface in surfaces.items()}
    for surface, answer in got.items():
        if isinstance(expected, str):
            assert isinstance(answer, str) and expected in answer, (surface, answer)
        else:
            assert answer == expected, (surface, answer)


def test_runtime_options_one_set_for_every_surface():
    """The CLI's flags, the llm plugin's options and the keyword arguments fill the same RuntimeOptions; a bad
    value is refused where it is given."""
    import sys
    from pathlib import Path

    from farctx.cli.options import runtime
    from farctx.context import RuntimeOptions

    flags = {"n_ctx": 0, "n_batch": 0, "n_ubatch": 64, "n_threads": 2, "n_gpu_layers": "all", "flash_attn": "on",
             "type_k": "q8_0", "type_v": "f16", "tensor_split": None, "rpc_servers": None}
    options = runtime(flags)
    assert not flags  # consumed
    assert options == RuntimeOptions(n_ubatch=64, n_threads=2, n_threads_batch=2, n_gpu_layers=-1, flash_attn=True,
                                     type_k="q8_0", type_v="f16")
    assert options.kwargs() == {"n_ubatch": 64, "n_threads": 2, "n_threads_batch": 2, "flash_attn": True,
                                "type_k": 8, "type_v": 1, "n_gpu_layers": -1}
    assert RuntimeOptions(**options.kwargs()) == options
    kwargs = {"n_ctx": 128, "n_ubatch": None, "chat_format": "chatml"}
    assert RuntimeOptions.take(kwargs) == RuntimeOptions(n_ctx=128) and kwargs == {"chat_format": "chatml"}
    with pytest.raises(farctx.FarctxError, match="quantized V cache"):
        RuntimeOptions(type_v="q8_0")
    with pytest.raises(farctx.FarctxError, match="unknown KV cache type"):
        RuntimeOptions(type_k="q3")

    sys.path.insert(0, str(Path(__file__).parent.parent / "llm-farctx"))
    import llm_farctx

    plugin_fields = set(llm_farctx.FarctxModel.Options.model_fields)
    assert set(llm_farctx._RUNTIME_FIELDS) <= plugin_fields <= (
        set(llm_farctx._METHOD_FIELDS) | set(RuntimeOptions.names()) | {"max_tokens", "temperature", "seed"})


def test_runtime_options_declared_once():
    """RuntimeOptions' fields are the one table: every command's runtime flags (bench's subset included), the
    server's, farctx.Llama's keyword arguments and the llm plugin's options are made from its rows."""
    import sys
    from pathlib import Path

    from farctx.cli.bench_cmd import BENCH_OPTIONS, bench
    from farctx.cli.main import main as cli
    from farctx.context import RuntimeOptions, option_infos

    rows = {o.name: o for o in option_infos()}
    assert list(rows) == list(RuntimeOptions.names())
    assert all(o.help for o in rows.values())
    flagged = {name for name, o in rows.items() if o.flags}
    commands = {name: cli.commands[name] for name in ("generate", "chat", "serve")}
    commands["eval ppl"] = cli.commands["eval"].commands["ppl"]
    for name, command in [*commands.items(), ("bench", bench)]:
        options = {p.name: p for p in command.params if p.name in rows}
        assert set(options) == (set(BENCH_OPTIONS) if name == "bench" else flagged), name
        for option in options.values():
            assert tuple(option.opts + option.secondary_opts) == rows[option.name].flags, (name, option.name)
            assert option.help == rows[option.name].help, (name, option.name)
    sys.path.insert(0, str(Path(__file__).parent.parent / "llm-farctx"))
    import llm_farctx

    fields = llm_farctx.FarctxModel.Options.model_fields
    for name, o in rows.items():
        assert (name in fields) == o.plugin, name
        if o.plugin:
            assert fields[name].description == o.help

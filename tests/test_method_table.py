"""libfarctx's method table is the one home of the method facts: the Python parameters, the CLI options,
the server's request fields, the llm plugin's options, cache sizing and `farctx info` all follow it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import pytest
from helpers import run_cli

import farctx
from farctx._native import native
from farctx.errors import NoSpaceError
from farctx.methods import ContextPlan, context_plan, method_infos

N = native()


def c_params() -> list[dict]:
    """The C parameter table, read field by field."""
    rows = []
    for i in range(N.lib.farctx_param_count()):
        r = N.lib.farctx_param_get_info(i)
        rows.append({"name": N.ffi.string(r.name).decode(), "default": r.default_value, "min": r.min_value,
                     "methods": r.methods, "offset": r.offset})
    return rows


def c_methods() -> list[str]:
    return [N.ffi.string(N.lib.farctx_method_get_info(m).name).decode() for m in range(N.lib.farctx_method_count())]


def test_the_table_describes_struct_farctx_params():
    rows = c_params()
    fields = [name for name, _ in N.ffi.typeof("struct farctx_params").fields if name != "method"]
    assert [r["name"] for r in rows] == fields
    assert [r["offset"] for r in rows] == [N.ffi.offsetof("struct farctx_params", f) for f in fields]
    defaults = N.lib.farctx_default_params()
    assert [getattr(defaults, r["name"]) for r in rows] == [r["default"] for r in rows]
    p = N.ffi.new("struct farctx_params *", defaults)
    for i, r in enumerate(rows):  # index-based get/set on the struct
        assert N.lib.farctx_param_set(p, i, 1000 + i) and getattr(p, r["name"]) == 1000 + i
        assert N.lib.farctx_param_get(p, i) == 1000 + i
    assert not N.lib.farctx_param_set(p, len(rows), 1)
    assert N.lib.farctx_param_get_info(len(rows)).name == N.ffi.NULL


def test_python_parameters_equal_the_c_table():
    rows = c_params()
    assert farctx.METHODS == tuple(c_methods())
    assert farctx.MethodParams.names() == [r["name"] for r in rows]
    default = farctx.MethodParams()
    assert [getattr(default, r["name"]) for r in rows] == [r["default"] for r in rows]
    for m, method in enumerate(c_methods()):
        readers = [r["name"] for r in rows if r["methods"] & (1 << m)]
        assert list(farctx.MethodParams(method=method).relevant()) == readers


def _method_options(command: click.Command) -> dict[str, click.Option]:
    names = set(farctx.MethodParams.names())
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name in names}


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "eval ppl", "eval passkey"])
def test_cli_options_equal_the_c_table(command):
    from farctx.cli.main import main

    cmd = main
    for word in command.split():
        cmd = cmd.commands[word]  # type: ignore[attr-defined]
    options = _method_options(cmd)
    rows = c_params()
    assert list(options) == [r["name"] for r in rows]
    for r in rows:
        opt = options[r["name"]]
        assert opt.opts == ["--" + r["name"].replace("_", "-")]
        assert opt.default is None and opt.type.min == r["min"]  # type: ignore[attr-defined]


def test_server_fields_equal_the_c_table():
    from farctx.serve.requests import FarctxOverride

    fields = FarctxOverride.model_fields
    rows = c_params()
    assert list(fields) == ["method"] + [r["name"] for r in rows]
    for r in rows:
        assert [m.ge for m in fields[r["name"]].metadata if hasattr(m, "ge")] == [r["min"]]
    with pytest.raises(ValueError):
        FarctxOverride(method="magic")


def test_llm_plugin_options_equal_the_c_table():
    sys.path.insert(0, str(Path(__file__).parent.parent / "llm-farctx"))
    import llm_farctx

    fields = llm_farctx.FarctxModel.Options.model_fields
    rows = c_params()
    assert [name for name in fields if name in {"method"} | {r["name"] for r in rows}] == \
        ["method"] + [r["name"] for r in rows]
    for r in rows:
        assert [m.ge for m in fields[r["name"]].metadata if hasattr(m, "ge")] == [r["min"]]


def test_cache_sizing_one_rule():
    """The plan's cells with no cache given: fixed-cache methods head + n_local + n_ubatch whatever the stream;
    the others the stream (n_prompt + n_predict), or, its length unknown, the trained context (stock inside it)
    or FARCTX_WHOLE_STREAM_DEFAULT times it. In a cache of n_ctx cells: what a stream may generate after its
    prompt, and NoSpaceError with the sizes when the prompt and what it asks for do not fit."""
    for name, info in method_infos().items():
        p = farctx.MethodParams(method=name, n_ctx_train=100, n_local=40, n_global=3, n_sink=2)

        def plan(**kw: int) -> ContextPlan:
            return context_plan(p, 0, n_ubatch=16, **kw)

        if info.fixed_cache:
            head = {"n_global": 3, "n_sink": 2, None: 0}[info.head]
            assert plan().n_ctx == plan(n_prompt=5000, n_predict=10).n_ctx == head + 40 + 16
            assert plan(n_ctx=512, n_prompt=5000, n_predict=10).n_predict_max == -1  # streams without bound
        else:
            assert plan().n_ctx == (100 if info.stock_inside or info.stock_graph else 4 * 100), name
            assert plan(n_prompt=5000, n_predict=10).n_ctx == 5010
            assert plan(n_ctx=512, n_prompt=500).n_predict_max == 12
            assert plan(n_ctx=512, n_prompt=500, n_predict=12).n_ctx_seq == 512
            with pytest.raises(NoSpaceError, match=r"500 prompt tokens \+ 13 to generate need 513 KV cells"):
                plan(n_ctx=512, n_prompt=500, n_predict=13)
            with pytest.raises(NoSpaceError, match="1 to generate"):
                plan(n_ctx=512, n_prompt=512)
    assert context_plan(farctx.MethodParams(method="streaming"), 64, n_ubatch=8).n_ctx == 64 + 8  # sinks + window
    assert context_plan(farctx.MethodParams(method="vanilla"), 64, n_ubatch=8).n_ctx == 64


@pytest.fixture(scope="module")
def refused_model(tmp_path_factory, default_model) -> Path:
    from refused_gguf import write_gpt2_gguf

    return write_gpt2_gguf(tmp_path_factory.mktemp("norope") / "gpt2.gguf", default_model)


def _c_support(path: Path) -> dict[str, str]:
    """farctx_method_supported straight from C on the loaded model."""
    from farctx._native import native
    from farctx.context import LoadedModel, RuntimeOptions

    out = {}
    nat = native()
    loaded = LoadedModel(path, RuntimeOptions())
    try:
        model = nat.llama_model_ptr(loaded.model.model)
        err = nat.ffi.new("char[]", 512)
        for m, name in enumerate(c_methods()):
            rc = nat.lib.farctx_method_supported(m, model, err, 512)
            out[name] = "" if rc == nat.lib.FARCTX_OK else nat.ffi.string(err).decode()
    finally:
        loaded.close()
    return out


def test_info_reports_c_refusal(refused_model):
    c = _c_support(refused_model)
    assert c["vanilla"] == "" and c["lminf"] == "no RoPE"
    result = run_cli("info", "-m", str(refused_model), "--json")
    assert result.returncode == 0, result.stderr
    reported = json.loads(result.stdout)["methods"]
    assert reported == {m: "yes" if not why else f"no: {why}" for m, why in c.items() if m != "auto"} | \
        {"auto": f"as vanilla: {c['lminf']}"}  # auto runs vanilla where no extension can run
    text = run_cli("info", "-m", str(refused_model))
    assert f"lminf        no: {c['lminf']}" in text.stdout
    # session init makes the same check, with the same reason
    with pytest.raises(farctx.FarctxError, match=f"lminf cannot run on this model \\({c['lminf']}\\)"):
        farctx.Llama(str(refused_model), method="lminf")


def test_info_on_a_supported_model(tiny_model):
    assert set(_c_support(tiny_model).values()) == {""}
    assert set(farctx.method_support(tiny_model).values()) == {"yes"}


def test_the_package_has_no_import_circle():
    """methods.py is a table that imports nothing back from the package but its errors and the native handle; the
    modules that own models and contexts reach libfarctx through _native, not through another module's privates."""
    import ast

    root = Path(farctx.__file__).parent

    def imports(name: str) -> set[str]:
        tree = ast.parse((root / f"{name}.py").read_text())
        return {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}

    assert imports("methods") <= {"errors", "_native"}
    assert "stream" not in imports("context")
    for name in ("engine", "batch"):  # they drive streams, but take the native handle from _native
        tree = ast.parse((root / f"{name}.py").read_text())
        from_stream = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "stream"
                       for a in n.names}
        assert not {a for a in from_stream if a.startswith("_") or a == "LOG"}, (name, from_stream)


# the suites that run every method, and the table in each that holds a method's test parameters or case
EVERY_METHOD = [("depth_worker", "PARAMS"), ("test_depth", "METHODS"), ("test_oracle_families", "CASES"),
                ("test_fa_layout", "METHOD_KWARGS"), ("test_rpc", "CASES")]


@pytest.mark.parametrize("module, table", EVERY_METHOD, ids=[m for m, _ in EVERY_METHOD])
def test_every_method_suite_covers_the_method_table(module, table):
    """A method added to libfarctx's table fails here, naming each suite that needs its test parameters, instead
    of being left out of it silently."""
    import importlib

    names = set(farctx.METHODS)
    held = set(getattr(importlib.import_module(module), table))
    assert held == names, f"tests/{module}.py {table}: missing {sorted(names - held)}, unknown {sorted(held - names)}"

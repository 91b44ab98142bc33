"""farctx eval ood / generate --ood-report: the factors read through llama.cpp's evaluation callback equal
the numpy oracle's (vanilla's stock graph, lminf's two key segments), the exit rule, the CLI outputs."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest
from helpers import random_tokens
from oracle import method_rule
from helpers import run_cli

import farctx
from farctx.eval.ood_recorder import OodRecorder, OodSettings, _first_run_outside, sampled_layers
from farctx.eval.tensor_probe import GgmlTensor, ggml_base, eval_callback_installed


def oracle_factors(oracle, tokens: list[int], rule) -> dict[str, np.ndarray]:
    """Per layer and position: max logit over heads and allowed keys, entropy mean/max over heads, layer output."""
    t, n = oracle.t, len(tokens)
    x = t["token_embd.weight"][np.asarray(tokens)] * oracle.family.embd_scale
    out = {"logit_max": [], "entropy_mean": [], "entropy_max": [], "l_out": []}
    group = oracle.n_head // oracle.n_head_kv
    for il, layer in enumerate(oracle.family.layers):
        p = f"blk.{il}."
        q, k, v = oracle._qkv(oracle._rms(x, t[p + "attn_norm.weight"]), p)
        lrule = oracle.layer_rule(il, rule)
        logit_max = np.full((oracle.n_head, n), -np.inf)
        entropy = np.zeros((oracle.n_head, n))
        rot = oracle._rotations(lrule, layer.rope)
        for h in range(oracle.n_head):
            s = np.where(lrule.allowed, oracle._scores(q[:, h], k[:, h // group], lrule, layer.rope, rot), -np.inf)
            logit_max[h] = s.max(axis=1)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            pr = e / e.sum(axis=1, keepdims=True)
            entropy[h] = -(np.where(pr > 0, pr * np.log(np.where(pr > 0, pr, 1)), 0)).sum(axis=1)
        out["logit_max"].append(logit_max.max(axis=0))
        out["entropy_mean"].append(entropy.mean(axis=0))
        out["entropy_max"].append(entropy.max(axis=0))
        a = oracle._attention(q, k, v, lrule, layer.rope).reshape(n, -1)
        x = x + oracle._linear(a, p + "attn_output")
        x = x + oracle._ffn(oracle._rms(x, t[p + "ffn_norm.weight"]), p)
        out["l_out"].append(x.copy())
    return {key: np.asarray(val) for key, val in out.items()}


def record(model, tokens, settings, **kwargs):
    recorder = OodRecorder(settings)
    with eval_callback_installed(recorder):
        llm = farctx.Llama(str(model), n_ubatch=16, n_batch=16, type_k=0, type_v=0, flash_attn=False, **kwargs)
    llm.eval(tokens)
    llm.close()
    return recorder, recorder.report()


@pytest.mark.parametrize("method", ["vanilla", "lminf"])
def test_factors_equal_the_oracle(tiny_model, oracle, method):
    n, n_train = 100, oracle.n_ctx_train
    tokens = random_tokens(n, seed=41)
    kwargs = {"n_ctx": 256} if method == "vanilla" else {"n_ctx": 256, "n_local": n_train, "n_global": 10}
    recorder, report = record(tiny_model, tokens, OodSettings(n_ctx_train=n_train, bucket=1), method=method, **kwargs)
    assert recorder.n_tokens == n and report.n_tokens == n
    rule = method_rule(method, n, n_train, 10) if method == "lminf" else method_rule("vanilla", n, n_train)
    ref = oracle_factors(oracle, tokens, rule)
    for layer in range(oracle.n_layer):
        for factor in ("logit_max", "entropy_mean", "entropy_max"):
            got = np.asarray(report.series[factor][layer], dtype=float)
            assert np.allclose(got, ref[factor][layer], rtol=1e-4, atol=1e-4), (factor, layer)
    # the last layer keeps only the sampled row: its output is left out, said so
    assert oracle.n_layer - 1 not in report.series["hidden_out"]
    h = ref["l_out"][0]
    lo, hi = h[:n_train].min(axis=0), h[:n_train].max(axis=0)
    fraction = ((h < lo) | (h > hi)).mean(axis=1)
    fraction[:n_train] = 0
    got = np.asarray(report.series["hidden_out"][0], dtype=float)
    assert np.abs(got - fraction).max() <= 2.5 / oracle.n_embd  # values at the range's edge may flip


def test_vanilla_entropy_grows_past_the_window_of_lminf(tiny_model):
    tokens = random_tokens(160, seed=5)
    settings = OodSettings(n_ctx_train=32, bucket=8)
    _, vanilla = record(tiny_model, tokens, settings, method="vanilla", n_ctx=256)
    _, lminf = record(tiny_model, tokens, settings, method="lminf", n_ctx=256, n_local=32, n_global=4)
    v, m = vanilla.summary("entropy_mean"), lminf.summary("entropy_mean")
    assert v[-1] > m[-1] + 0.3  # 160 keys against 36
    assert vanilla.exits["entropy_mean"] is not None and vanilla.exits["entropy_mean"].position >= 32


def test_first_run_outside():
    values = [1.0, 2.0, 1.5, 5.0, 1.0, 5.0, 5.0, 5.0, 0.0]
    assert _first_run_outside(values, list(range(3, 9)), 0.5, 2.5, 3) == 5
    assert _first_run_outside(values, list(range(3, 9)), 0.5, 2.5, 1) == 3
    assert _first_run_outside(values, list(range(3, 9)), -1, 6, 1) is None
    assert _first_run_outside([None, 9.0, 9.0], [1, 2], 0, 1, 4) == 1  # fewer buckets than persist: all of them


def test_sampled_layers():
    assert sampled_layers(30) == [0, 10, 19, 29]
    assert sampled_layers(3) == [0, 1, 2]


def test_tensor_struct_layout():
    """GgmlTensor matches the loaded ggml: a tensor made by ggml itself reads back its type, shape, strides, name."""
    lib = ggml_base()

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

    lib.ggml_init.restype, lib.ggml_init.argtypes = ctypes.c_void_p, [InitParams]
    lib.ggml_new_tensor_3d.restype = ctypes.c_void_p
    lib.ggml_new_tensor_3d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    lib.ggml_set_name.restype, lib.ggml_set_name.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_soft_max.restype, lib.ggml_soft_max.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]
    lib.ggml_free.argtypes = [ctypes.c_void_p]
    ctx = lib.ggml_init(InitParams(1 << 20, None, True))
    try:
        a = lib.ggml_new_tensor_3d(ctx, 1, 5, 3, 2)
        lib.ggml_set_name(a, b"kq-7")
        b = lib.ggml_soft_max(ctx, a)
        ta, tb = GgmlTensor.from_address(a), GgmlTensor.from_address(b)
        assert ta.type == 1 and list(ta.ne) == [5, 3, 2, 1] and list(ta.nb) == [2, 10, 30, 60]
        assert ta.name == b"kq-7" and tb.src[0] == a and tb.type == 1 and list(tb.ne) == [5, 3, 2, 1]
        assert lib.ggml_op_name(tb.op) == b"SOFT_MAX"
    finally:
        lib.ggml_free(ctx)


def test_no_callback_unless_asked(tiny_model):
    llm = farctx.Llama(str(tiny_model), n_ctx=64)
    assert not llm.context_params.cb_eval  # a NULL function pointer
    llm.close()


def test_callback_only_for_the_installing_thread(tiny_model):
    """While the callback is installed, a context another thread builds (a server's) gets none."""
    import threading

    got: dict[str, object] = {}

    def other_thread() -> None:
        llm = farctx.Llama(str(tiny_model), n_ctx=64)
        got["other"] = bool(llm.context_params.cb_eval)
        llm.close()

    with eval_callback_installed(OodRecorder(OodSettings(n_ctx_train=32, bucket=8))):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        mine = farctx.Llama(str(tiny_model), n_ctx=64)
    assert got["other"] is False and bool(mine.context_params.cb_eval) is True
    mine.close()


def test_cli_eval_ood_json_png_and_errors(tmp_path, tiny_model):
    text = tmp_path / "doc.txt"
    text.write_text(" ".join(f"sentence number {k} is here." for k in range(200)))
    out = run_cli("eval", "ood", "-m", str(tiny_model), "-f", str(text), "--methods", "vanilla,lminf",
                  "--lengths", "32,96", "--n-global", "4", "-fa", "on",
                  "--json", str(tmp_path / "ood.json"), "--plot", str(tmp_path / "ood.png"))
    assert out.returncode == 0, out.stderr
    assert "flash attention forced off" in out.stderr and "cost:" in out.stderr
    assert "| vanilla " in out.stdout and "stays inside" in out.stdout  # lminf on the entropy factors
    payload = json.loads((tmp_path / "ood.json").read_text())
    assert payload["flash_attn"] == "off" and [r["method"] for r in payload["runs"]] == ["vanilla", "lminf"]
    assert payload["runs"][0]["n_tokens"] == 96
    assert (tmp_path / "ood.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_cli("eval", "ood", "-m", str(tiny_model), "-f", str(text), "-ctv", "q8_0")
    assert bad.returncode == 2 and "quantized V cache" in bad.stderr
    bad = run_cli("eval", "ood", "-m", str(tiny_model), "-f", str(text), "--layers", "7")
    assert bad.returncode == 2 and "layers are 0..1" in bad.stderr


def test_cli_generate_ood_report(tmp_path, tiny_model):
    prompt = " ".join(f"word{k}" for k in range(60))
    out = run_cli("generate", "-m", str(tiny_model), "-p", prompt, "-n", "4", "--temp", "0", "--method", "lminf",
                  "--n-global", "4", "--ood-report", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["ood"]["verdict"].startswith(("stayed inside", "left the trained distribution at token"))
    assert result["ood"]["n_tokens"] >= 60

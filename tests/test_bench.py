"""farctx bench: the harness's arithmetic and output formats (no timed assertions)."""

from __future__ import annotations

import json

from helpers import run_cli

from farctx.bench.harness import BenchResult, markdown_table, median, paired_ratio, scaling, scaling_table, vanilla_table


def test_median_skips_missing_values():
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([None, None]) is None
    assert median([]) is None


def test_ratio_and_table():
    r = BenchResult("lminf", 4096, prefill_tps=90.0, decode_tps=30.0, kv_bytes=2**21, rss_bytes=2**28,
                    stock_prefill_tps=100.0, stock_decode_tps=None)
    assert r.ratio("prefill") == 0.9
    assert r.ratio("decode") is None
    table = markdown_table([r]).splitlines()
    assert table[0].startswith("| method | length | prefill tok/s | vs stock |")
    assert table[2] == "| lminf | 4096 | 90.0 | 0.900 | 30.0 | - | 2.0 | 256 |"
    assert set(r.as_dict()) == {"method", "length", "prefill_tps", "decode_tps", "kv_bytes", "rss_bytes",
                                "stock_prefill_tps", "stock_decode_tps", "vs_vanilla_prefill", "vs_vanilla_decode"}
    assert vanilla_table([r]) == ""  # no vanilla in the run


def test_paired_ratio_is_per_round():
    """A machine that slows down in the second round moves both figures: the paired ratio sees 0.9 both times,
    where the ratio of the medians would not."""
    ours = [{"prefill_tps": 90.0}, {"prefill_tps": 45.0}, {"prefill_tps": None}]
    base = [{"prefill_tps": 100.0}, {"prefill_tps": 50.0}, {"prefill_tps": 80.0}]
    assert abs(paired_ratio(ours, base, "prefill_tps") - 0.9) < 1e-12
    assert paired_ratio(ours, base, "decode_tps") is None
    r = BenchResult("dca", 8192, 90.0, 30.0, 0, 0, None, None, vs_vanilla_prefill=0.9, vs_vanilla_decode=None)
    assert vanilla_table([r]).splitlines()[2] == "| dca | 8192 | 0.900 | - |"


def test_scaling_exponents():
    def row(n: int, prefill_tps: float, decode_tps: float) -> BenchResult:
        return BenchResult("m", n, prefill_tps, decode_tps, 0, 0, None, None)

    quadratic = [row(1000, 100.0, 50.0), row(4000, 25.0, 50.0), row(16000, 6.25, 50.0)]  # time ~ n^2, decode flat
    exps = scaling(quadratic)["m"]
    assert abs(exps["prefill_time"] - 2.0) < 1e-9 and abs(exps["decode_time_per_token"]) < 1e-9
    assert scaling([row(1000, 100.0, 50.0)])["m"]["prefill_time"] is None
    assert scaling_table(quadratic).splitlines()[2] == "| m | 2.00 | 0.00 |"


def test_cli_bench_writes_the_contract(tmp_path, tiny_model):
    out = tmp_path / "bench.json"
    result = run_cli("bench", "-m", str(tiny_model), "--methods", "vanilla,lminf", "--lengths", "64,128",
                     "--reps", "1", "-n", "2", "--n-global", "4", "--json", str(out), "--plot", str(tmp_path / "bench.png"))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["n_ctx_train"] == 32 and report["machine"]
    rows = report["results"]
    assert [(r["method"], r["length"]) for r in rows] == [("vanilla", 64), ("vanilla", 128), ("lminf", 64), ("lminf", 128)]
    for r in rows:
        assert r["prefill_tps"] > 0 and r["decode_tps"] > 0 and r["kv_bytes"] > 0 and r["rss_bytes"] > 0
        assert r["stock_prefill_tps"] > 0 and r["stock_decode_tps"] > 0  # stock ran in the same run
    assert "| lminf | 128 |" in result.stdout
    assert set(report["scaling"]) == {"vanilla", "lminf"} and "scaling with length" in result.stdout
    assert all(r["vs_vanilla_prefill"] > 0 for r in rows) and "| lminf | 128 |" in result.stdout.split("against vanilla")[1]
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_stock_library_found_or_named(tmp_path, monkeypatch):
    """The checkout's stock build is what the setup made; a folder given by FARCTX_STOCK_LIB_DIR is never built."""
    import pytest

    from farctx import FarctxError
    from farctx.bench.harness import stock_lib_dir

    assert (stock_lib_dir() / "libllama.so").exists()
    monkeypatch.setenv("FARCTX_STOCK_LIB_DIR", str(tmp_path))
    with pytest.raises(FarctxError, match=f"stock llama.cpp not built in {tmp_path}"):
        stock_lib_dir()

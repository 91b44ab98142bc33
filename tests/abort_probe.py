"""Worker of tests/test_no_abort.py (and of probes of random sizes): sizes a caller chooses, each through the
Python API in this process; prints one JSON line per case with what came of it ("ok", or the error's message). An
abort inside llama.cpp ends the process, which the test reports with the case that was running (the last "start"
line on stderr).

    python abort_probe.py MODEL CASES_JSON
"""

from __future__ import annotations

import json
import sys

import numpy as np

import farctx
from farctx.batch import SequenceBatch


def run_case(model: str, case: dict) -> str:
    kind = case["kind"]
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 49152, case["n_prompt"] + case.get("n_decode", 2)).tolist()
    n_prompt = case["n_prompt"]
    try:
        if kind == "batch":
            batch = SequenceBatch(model, n_seq=case["n_seq"], n_ctx_seq=case["n_ctx_seq"], n_batch=case["n_batch"],
                                  n_ubatch=case["n_ubatch"], flash_attn=case["fa"], type_k=case.get("type_k", 1),
                                  type_v=case.get("type_v", 1), n_threads=2)
            try:
                feeding = case.get("feeding", [0])
                for seq in feeding:
                    batch.open(seq, case["method"], **case.get("params", {}))
                batch.step({seq: tokens[:n_prompt] for seq in feeding})
                for t in tokens[n_prompt:]:
                    batch.step({seq: [t] for seq in feeding})
            finally:
                batch.close()
        else:
            llm = farctx.Llama(model, method=case["method"], n_ctx=case["n_ctx"], n_batch=case["n_batch"],
                               n_ubatch=case["n_ubatch"], flash_attn=case["fa"], verbose=False,
                               **case.get("params", {}))
            try:
                llm.eval(tokens[:n_prompt])
                for t in tokens[n_prompt:]:
                    llm.eval([t])
            finally:
                llm.close()
        return "ok"
    except (farctx.FarctxError, ValueError) as err:
        return f"{type(err).__name__}: {err}"


def main() -> None:
    model = sys.argv[1]
    cases = json.loads(open(sys.argv[2]).read())
    for case in cases:
        print("start " + json.dumps(case), file=sys.stderr, flush=True)
        print(json.dumps({"case": case, "result": run_case(model, case)}), flush=True)


if __name__ == "__main__":
    main()

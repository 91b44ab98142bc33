"""Worker of tests/test_depth.py: one method and one KV setting on the deep model, run in its own process so that
an abort inside llama.cpp fails one test instead of ending the suite.

For n_seq in {1, 2, 4, 8}: n_seq streams of the method through one farctx.SequenceBatch (their prompts fed in
pieces beside the others' decoding, Mesa's whole), then N_DECODE tokens each; every stream's logits (after its
prompt and after each decoded token) are compared with that stream run alone (a one-stream context). Prints one
JSON object: per n_seq, per stream, the largest difference and the logit scale. With `deterministic`, every
context runs batch-invariant kernels (SequenceBatch(deterministic=True)).

    python depth_worker.py MODEL METHOD TYPE_K TYPE_V FLASH_ATTN(0/1) [deterministic]
"""

from __future__ import annotations

import json
import sys

import numpy as np

from farctx.batch import SequenceBatch

N_CTX_TRAIN = 32
N_DECODE = 10
PIECE = 24
N_SEQS = (1, 2, 4, 8)

# past n_local (32) and n_ctx_train (32); Mesa: chunks of the prompt and stair moves while decoding
PARAMS: dict[str, dict[str, int]] = {
    "vanilla": {},
    "lminf": {"n_local": 32, "n_global": 10},
    "window": {"n_local": 32},
    "lambda-only": {"n_local": 32, "n_global": 10},
    "rerope": {"n_local": 32},
    "streaming": {"n_local": 28, "n_sink": 4},
    "mesa": {"first_chunk": 4, "stair_width": 2, "last_context": 8, "gen_budget": 2},
    "selfextend": {"group": 4, "neighbor": 8},
    "dca": {"chunk_size": 24, "local_window": 4},
    "string": {"shifted_offset": 12, "local_value": 4},
    "auto": {"chunk_size": 24, "local_window": 4},
}


def stream_tokens(i: int) -> tuple[int, list[int]]:
    """Stream i's prompt length and tokens: different lengths, so the streams cross their boundaries at different
    steps."""
    n_prompt = 70 + 9 * i
    rng = np.random.default_rng(500 + i)
    return n_prompt, rng.integers(0, 49152, n_prompt + N_DECODE).tolist()


def run(model: str, method: str, n_seq: int, kv: tuple[int, int, bool], streams: list[int],
        alone: bool, deterministic: bool = False) -> dict[int, np.ndarray]:
    """Logits of the given streams (after the prompt, after each decoded token): together in one context of n_seq
    sequences, or (alone) one after another through sequence 0 of it."""
    type_k, type_v, fa = kv
    batch = SequenceBatch(model, n_seq=n_seq, n_ctx_seq=256, n_batch=64, n_ubatch=16, type_k=type_k,
                          type_v=type_v, flash_attn=fa, n_threads=2, deterministic=deterministic)
    got: dict[int, list[np.ndarray]] = {i: [] for i in streams}
    try:
        groups = [[i] for i in streams] if alone else [streams]
        for group in groups:
            seqs = {i: (0 if alone else k) for k, i in enumerate(group)}
            toks = {i: stream_tokens(i) for i in group}
            fed = dict.fromkeys(group, 0)
            for i in group:
                batch.open(seqs[i], method, n_ctx_train=N_CTX_TRAIN, **PARAMS[method])
            while True:
                feeds = {}
                for i in group:
                    n_prompt, tokens = toks[i]
                    if fed[i] == len(tokens):
                        continue
                    # Mesa's chunks follow from the prompt's length; dca's prompt of 64 tokens or more crosses
                    # phases inside its ubatches (the rotated copy), pieces of PIECE tokens stop at each phase
                    whole = method == "mesa" or (method == "dca" and i % 2 == 0)
                    n = (n_prompt if whole else min(PIECE, n_prompt - fed[i])) if fed[i] < n_prompt else 1
                    feeds[seqs[i]] = tokens[fed[i] : fed[i] + n]
                if not feeds:
                    break
                out = batch.step(feeds)
                for i in group:
                    if seqs[i] in feeds:
                        fed[i] += len(feeds[seqs[i]])
                        if fed[i] >= toks[i][0]:
                            got[i].append(out[seqs[i]].astype(np.float64))
            for i in group:
                assert batch.n_past(seqs[i]) == len(toks[i][1]), (i, batch.n_past(seqs[i]))
                batch.release(seqs[i])
    finally:
        batch.close()
    return {i: np.array(g) for i, g in got.items()}


def main() -> None:
    model, method = sys.argv[1], sys.argv[2]
    kv = (int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")
    det = len(sys.argv) > 6 and sys.argv[6] == "deterministic"
    ref = run(model, method, 1, kv, list(range(max(N_SEQS))), alone=True, deterministic=det)
    report: dict[str, object] = {}
    for n_seq in N_SEQS:
        got = ref if n_seq == 1 else run(model, method, n_seq, kv, list(range(n_seq)), alone=False,
                                         deterministic=det)
        rows = []
        for i in range(n_seq):
            assert got[i].shape == ref[i].shape == (N_DECODE + 1, ref[i].shape[1]), (n_seq, i, got[i].shape)
            rows.append({"max_diff": float(np.abs(got[i] - ref[i]).max()), "scale": float(np.abs(ref[i]).max()),
                         "spread": float(np.abs(ref[i] - ref[i].mean()).max())})
        report[str(n_seq)] = rows
    # the streams' own logits differ from each other's by far more than any tolerance: a mix-up would show
    last = [ref[i][-1] for i in range(max(N_SEQS))]
    report["distinct"] = min(float(np.abs(a - b).max()) for k, a in enumerate(last) for b in last[k + 1 :])
    print(json.dumps(report))


if __name__ == "__main__":
    main()

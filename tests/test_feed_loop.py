"""libfarctx's one feed loop: farctx_session_feed is farctx_sessions_feed for one session (one chunking rule,
progress, all logits), so one stream read through farctx.Llama gives what the same stream gives alone in a
SequenceBatch."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import random_tokens

import farctx
from farctx.batch import SequenceBatch

MESA = dict(first_chunk=4, stair_width=2, last_context=8, gen_budget=2)
PARAMS = {"vanilla": {}, "lminf": {}, "mesa": MESA}
N_UBATCH, N_BATCH, CELLS = 16, 64, 256


def _llama_rows(model, method, tokens, progress=None):
    llm = farctx.Llama(str(model), method=method, n_ctx=CELLS, n_batch=N_BATCH, n_ubatch=N_UBATCH,
                       progress=progress, **PARAMS[method])
    try:
        prompt = llm.score(tokens[:-4])
        steps = [llm.score([t])[0] for t in tokens[-4:]]
        return np.vstack([prompt[-1:], *steps[:-1]]), steps[-1], llm.stats()
    finally:
        llm.close()


def _batch_rows(model, method, tokens):
    with SequenceBatch(str(model), n_seq=2, n_ctx_seq=CELLS, n_batch=N_BATCH, n_ubatch=N_UBATCH) as batch:
        batch.open(1, method, **PARAMS[method])
        rows = [batch.step({1: tokens[:-4]})[1]]
        rows += [batch.step({1: [t]})[1] for t in tokens[-4:]]
        return np.vstack(rows[:-1]), rows[-1], batch.stats(1)


@pytest.mark.parametrize("method", list(PARAMS))
def test_one_session_feeds_as_the_batch_feeds_it(tiny_model, method):
    tokens = random_tokens(70, seed=11)  # past n_local = n_ctx_train = 32; mesa: several chunks and stair moves
    rows, last, stats = _llama_rows(tiny_model, method, tokens)
    batch_rows, batch_last, batch_stats = _batch_rows(tiny_model, method, tokens)
    np.testing.assert_allclose(rows, batch_rows, rtol=0, atol=1e-5)
    np.testing.assert_allclose(last, batch_last, rtol=0, atol=1e-5)
    # the same llama_decode calls: ubatch-sized chunks, one per decoded token
    assert stats["n_decode"] == batch_stats["n_decode"] and stats["n_past"] == batch_stats["n_past"] == 70
    # the check can fail: another stream differs
    _, other, _ = _batch_rows(tiny_model, method, random_tokens(70, seed=12))
    assert np.abs(other - last).max() > 1e-2


def test_progress_counts_every_chunk_and_cancels(tiny_model):
    seen: list[tuple[int, int]] = []
    _llama_rows(tiny_model, "lminf", random_tokens(70, seed=3), progress=lambda d, t: seen.append((d, t)))
    prompt = [d for d, t in seen if t == 66]
    assert prompt[0] == 0, "a feed starts with (0, total)"
    assert prompt == sorted(prompt) and prompt[-1] == 66 and len(prompt) == 1 + -(-66 // N_UBATCH)

    def stop(done: int, total: int) -> None:
        if done >= 32:
            raise KeyboardInterrupt

    llm = farctx.Llama(str(tiny_model), method="lminf", n_batch=N_BATCH, n_ubatch=N_UBATCH, progress=stop)
    with pytest.raises(KeyboardInterrupt):
        llm.eval(random_tokens(70, seed=3))
    assert llm.n_tokens == 0 and llm.stats()["n_past"] == 0  # nothing of the cancelled feed stays

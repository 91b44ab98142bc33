"""Sampling a token from a logits row with llama.cpp's sampler chain (what `llama_sampler_sample` does
with a context's logits, done on a numpy row): the chain llama-cpp-python builds for a request
(penalties, grammar, logit bias, top-k/typical/top-p/min-p, temperature, seeded dist or greedy)
applies unchanged, so a row sampled here gives the token llama_cpp.Llama would give."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class RowSampler:
    """One request's sampler chain (a `llama_cpp._internals.LlamaSampler`) over rows of n_vocab logits."""

    def __init__(self, chain: Any, n_vocab: int) -> None:
        from .._native import native

        self._lc = native().llama_cpp
        self.chain = chain
        self.n_vocab = n_vocab
        self._data = np.zeros(n_vocab, dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)],
                                                      align=True))
        self._ids = np.arange(n_vocab, dtype=np.intc)
        self._array = self._lc.llama_token_data_array(
            data=self._data.ctypes.data_as(self._lc.llama_token_data_p), size=n_vocab, selected=-1, sorted=False)

    def sample(self, logits: np.ndarray) -> int:
        """The chain applied to `logits` ([n_vocab] float32), the chosen token accepted into its state."""
        self._data["id"] = self._ids
        self._data["logit"] = logits
        self._data["p"] = 0.0
        self._array.data = self._data.ctypes.data_as(self._lc.llama_token_data_p)
        self._array.size = self.n_vocab
        self._array.selected = -1
        self._array.sorted = False
        self._lc.llama_sampler_apply(self.chain.sampler, ctypes.byref(self._array))
        selected = int(self._array.selected)
        if not 0 <= selected < int(self._array.size):
            raise RuntimeError("the sampler chain selected no token")
        # the chain may have reordered the array (top-k sorts it): read through the pointer it left
        token = int(self._array.data[selected].id)
        self._lc.llama_sampler_accept(self.chain.sampler, token)
        return token

    def close(self) -> None:
        self.chain.close()

"""The llama_cpp.Llama face of one server request: what llama-cpp-python's own completion and chat code (its
tokenizing, chat templates, stop strings, UTF-8 boundaries, chunk and response shapes, finish_reason, usage) sees.

Attributes come from the server's vocabulary-only llama_cpp.Llama (the tokenizer and the chat template); seed,
max_tokens and generation are the request's own, and `generate` hands the prompt tokens and the request's sampler
chain to `run` (the server's scheduler). It is given everything it uses when it is made. llama_cpp's code stops reading (a stop string, max_tokens) by closing the
generator: that cancels the request's slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import numpy as np

from ..errors import FarctxError
from ..grammar import check_grammar
from .sampling import RowSampler

if TYPE_CHECKING:
    from .job import Job
    from .scheduler import Request

# the server's generation: (the request's view, prompt tokens, its sampler, llama_cpp's stopping criteria) -> tokens
Run = Callable[["RequestView", list[int], RowSampler, Any], Iterator[int]]


class RequestView:
    """llama_cpp.Llama as llama-cpp-python's completion code sees it, for one request: attributes come
    from the shared vocabulary-only front; seed, max_tokens and generation are the request's own."""

    def __init__(self, front: Any, pieces: "Pieces", job: "Job", method: dict[str, Any],
                 progress: Callable[[int, int], None], *, seed: int, n_vocab: int, run: Run) -> None:
        self._front = front  # the vocabulary-only llama_cpp.Llama
        self._pieces = pieces
        self._n_vocab = n_vocab
        self._run = run
        self.job = job
        self.method = method  # this request's method and parameters
        self.progress = progress
        self._seed = seed
        self._n_ctx = 2**31 - 1  # llama_cpp bounds prompts by this: the scheduler checks them instead
        self.max_tokens: Optional[int] = None
        self.last_prompt_tokens = 0
        self.request: Optional[Request] = None
        self._prompt_ready = False  # create_completion reached: the chat template has rendered the messages
        # llama_cpp reads these after its generation loop (stopping criteria): the stream, a logits row
        self._input_ids = np.zeros(0, dtype=np.intc)
        self._scores = np.zeros((1, 1), dtype=np.single)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._front, name)

    def show_stream(self, tokens: list[int]) -> np.ndarray:
        """The request's stream so far, where llama_cpp's completion code reads it (`_input_ids`); returned for the
        caller's own stopping criteria."""
        self._input_ids = np.asarray(tokens, dtype=np.intc)
        return self._input_ids

    def scores_row(self) -> np.ndarray:
        """The logits row llama_cpp's stopping criteria are given (the server keeps no logits: a placeholder)."""
        return self._scores[-1, :]

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def detokenize(self, tokens: list[int], prev_tokens: Optional[list[int]] = None, special: bool = False) -> bytes:
        """llama_cpp.Llama.detokenize's bytes, from the server's cache of token pieces: llama_cpp's streaming
        code detokenizes the whole answer again at every token, one ctypes call per token."""
        return self._pieces.detokenize(tokens, special)

    def create_completion(self, prompt: Any, *args: Any, **kwargs: Any) -> Any:
        self.max_tokens = kwargs.get("max_tokens", args[1] if len(args) > 1 else 16)
        self._prompt_ready = True
        return self._llama_cpp().Llama.create_completion(self, prompt, *args, **kwargs)

    def _create_completion(self, *args: Any, **kwargs: Any) -> Any:
        return self._llama_cpp().Llama._create_completion(self, *args, **kwargs)

    def create_chat_completion(self, *args: Any, **kwargs: Any) -> Any:
        """llama_cpp's chat completion. It renders the messages with the model's chat template, then calls
        create_completion: a failure before that is the request's (messages the template cannot render, such as
        a message without content or roles out of the template's order), answered as a 400 naming the cause."""
        self._prompt_ready = False
        try:
            return self._llama_cpp().Llama.create_chat_completion(self, *args, **kwargs)
        except (FarctxError, ValueError):
            raise
        except Exception as exc:
            if self._prompt_ready:
                raise
            raise FarctxError(f"messages: the model's chat template cannot render them "
                              f"({type(exc).__name__}: {exc})") from exc

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: Any = None, stopping_criteria: Any = None,
                 grammar: Any = None) -> Iterator[int]:
        """The tokens the scheduler samples for `tokens` under this request's sampler chain (llama_cpp's)."""
        check_grammar(self._front._model.vocab, grammar)
        chain = self._llama_cpp().Llama._init_sampler(
            self, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp,
            repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            penalize_nl=penalize_nl, logits_processor=logits_processor, grammar=grammar)
        return self._run(self, list(tokens), RowSampler(chain, self._n_vocab), stopping_criteria)

    @staticmethod
    def _llama_cpp() -> Any:
        from .._native import native

        return native().llama_cpp


class Pieces:
    """Each token's text (llama_token_to_piece), looked up once; detokenize as llama_cpp's LlamaModel does."""

    def __init__(self, front: Any) -> None:
        self._front = front
        self._bos = front.token_bos()
        # the whole vocabulary at start (a fraction of a second): memory does not grow with the tokens seen
        self._cache: dict[tuple[int, bool], bytes] = {
            (token, special): _raw_piece(front, token, special)
            for token in range(front.n_vocab()) for special in (False, True)}

    def piece(self, token: int, special: bool) -> bytes:
        key = (token, special)
        piece = self._cache.get(key)
        if piece is None:
            piece = self._cache[key] = _raw_piece(self._front, token, special)
        return piece

    def detokenize(self, tokens: list[int], special: bool) -> bytes:
        output = b"".join([self.piece(int(t), special) for t in tokens])
        if tokens and tokens[0] == self._bos and output[:1] == b" ":
            return output[1:]
        return output


def _raw_piece(front: Any, token: int, special: bool) -> bytes:
    """llama_token_to_piece's bytes for one token (no BOS rule)."""
    import ctypes

    from .._native import native

    lc = native().llama_cpp
    buffer = (ctypes.c_char * 32)()
    n = lc.llama_token_to_piece(front._model.vocab, lc.llama_token(token), buffer, 32, 0, special)
    return bytes(buffer[:max(0, n)])

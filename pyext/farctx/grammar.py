"""A request's grammar checked by llama.cpp's parser before a sampler chain holds it.

llama_sampler_init_grammar returns NULL for a grammar it cannot parse, and llama-cpp-python adds what it returns
to the sampler chain unchecked: the first sample then dereferences NULL and the process dies (stock
llama_cpp.Llama included). farctx.Llama and the server's requests check first and refuse with an error.
"""

from __future__ import annotations

from typing import Any

from .errors import FarctxError


def check_grammar(vocab: Any, grammar: Any) -> None:
    """Raise FarctxError unless llama.cpp parses `grammar` (a llama_cpp.LlamaGrammar, or None: nothing to check)."""
    if grammar is None:
        return
    from ._native import native

    lc = native().llama_cpp
    try:
        text, root = grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FarctxError(f"grammar: not valid UTF-8 ({exc})") from None
    sampler = lc.llama_sampler_init_grammar(vocab, text, root)
    if not sampler:
        raise FarctxError("grammar: llama.cpp's GBNF parser refused it (its message is on stderr)")
    lc.llama_sampler_free(sampler)

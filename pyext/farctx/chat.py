"""`farctx chat`: a conversation in the terminal, with the model's chat template, past n_ctx_train.

Each line on stdin is a user message; the answer streams to stdout. `/exit` (or end of input)
ends the chat. The whole conversation is sent each turn to one `farctx.Llama` (llama_cpp reuses the
prefix it has already read): with the fixed-cache methods (lminf) the cache stays the same size however
long the conversation gets, and the fixed head of every prompt (BOS, the system prompt, the first user
header) is the head the method keeps; the other methods keep the whole conversation in their cache and
say when it is full (the turn is dropped, the conversation goes on).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Optional, TextIO

from .errors import ContextSizeError, NoSpaceError

EXIT_COMMANDS = ("/exit", "/quit", "/bye")


def fixed_head_tokens(model_path: str, system: Optional[str]) -> int:
    """Tokens every prompt of a conversation starts with: the chat template rendered for two
    different first messages agree on BOS, the system prompt (the template's own when none is
    given) and the header of the first user turn."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from .stream import open_tokenizer

    vocab = open_tokenizer(model_path)
    try:
        template = vocab.metadata.get("tokenizer.chat_template")
        if template is None:
            return 0
        text = vocab._model.token_get_text
        formatter = Jinja2ChatFormatter(template, eos_token=text(vocab.token_eos()), bos_token=text(vocab.token_bos()))
        head = [{"role": "system", "content": system}] if system else []
        a, b = (vocab.tokenize(formatter(messages=head + [{"role": "user", "content": c}]).prompt.encode("utf-8"),
                               add_bos=True, special=True) for c in ("a", "z"))
    finally:
        vocab.close()
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@dataclass
class Chat:
    """A conversation with a farctx.Llama: `messages` grows turn by turn."""

    llm: Any
    system: Optional[str] = None
    document: Optional[str] = None  # prefixed to the first user message
    sampling: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.system and not self.messages:
            self.messages.append({"role": "system", "content": self.system})

    def turn(self, text: str, out: TextIO) -> str:
        """Send one user message, stream the answer to `out`, keep both in the conversation."""
        document, self.document = self.document, None
        self.messages.append({"role": "user", "content": text if document is None else f"{document}\n\n{text}"})
        pieces: list[str] = []
        try:
            try:
                stream = self.llm.create_chat_completion(messages=self.messages, stream=True, **self.sampling)
                for chunk in stream:
                    piece = chunk["choices"][0]["delta"].get("content")
                    if piece:
                        pieces.append(piece)
                        out.write(piece)
                        out.flush()
            except ValueError as exc:  # llama_cpp's check of the prompt against the cache
                if "exceed context window" not in str(exc):
                    raise
                raise ContextSizeError(f"the conversation no longer fits the cache: {exc}", 0,
                                       self.llm.n_ctx()) from None
        except BaseException:
            self.messages.pop()  # the turn did not happen
            self.document = document
            raise
        answer = "".join(pieces)
        self.messages.append({"role": "assistant", "content": answer})
        return answer


def run_chat(chat: Chat, stdin: Optional[TextIO] = None, stdout: Optional[TextIO] = None,
             stderr: Optional[TextIO] = None) -> None:
    """The read-answer loop; a message that does not fit (vanilla) is reported and dropped."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    interactive = stdin.isatty()
    while True:
        if interactive:
            stderr.write("> ")
            stderr.flush()
        line = stdin.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if text.strip() in EXIT_COMMANDS:
            break
        if not text.strip():
            continue
        try:
            chat.turn(text, stdout)
        except (ContextSizeError, NoSpaceError) as exc:
            stderr.write(f"farctx: {exc} (the message is dropped; -c sets the cache)\n")
            continue
        stdout.write("\n")
        stdout.flush()

"""llm plugin: farctx models in simonw's `llm` CLI.

    llm farctx add model.gguf --alias mymodel      # registers farctx/mymodel
    llm -m farctx/mymodel -o method lminf "..."    # -o takes every farctx method parameter
    llm -m farctx "..."                            # the bundled default model

Registered models live in `farctx-models.json` in llm's user directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Optional

import click
import llm
from pydantic import Field, create_model, field_validator

import farctx  # first: points llama_cpp at farctx's patched library
from farctx.context import option_infos
from farctx.methods import DEFAULT_GENERATION, DEFAULT_METHOD, fixed_cache

REGISTRY = "farctx-models.json"


def _registry_path() -> Path:
    return llm.user_dir() / REGISTRY


def registered() -> dict[str, str]:
    path = _registry_path()
    return json.loads(path.read_text()) if path.exists() else {}


@llm.hookimpl
def register_models(register: Any) -> None:
    try:
        register(FarctxModel("farctx", str(farctx.default_model_path(install=False))))
    except farctx.FarctxError:
        pass  # no bundled model here
    for alias, path in sorted(registered().items()):
        register(FarctxModel(f"farctx/{alias}", path))


@llm.hookimpl
def register_commands(cli: click.Group) -> None:
    @cli.group(name="farctx")
    def farctx_group() -> None:
        """farctx models: GGUF files run past their trained context."""

    @farctx_group.command(name="add")
    @click.argument("path", type=click.Path(exists=True, dir_okay=False, resolve_path=True))
    @click.option("--alias", default=None, help="model name after farctx/ (default: the file name)")
    def add(path: str, alias: Optional[str]) -> None:
        """Register a GGUF file as farctx/ALIAS."""
        farctx.model_info(path)  # a clear error for a file that is not a model
        models = registered()
        name = alias or Path(path).stem
        models[name] = path
        _registry_path().parent.mkdir(parents=True, exist_ok=True)
        _registry_path().write_text(json.dumps(models, indent=2))
        click.echo(f"farctx/{name}: {path}")

    @farctx_group.command(name="remove")
    @click.argument("alias")
    def remove(alias: str) -> None:
        """Forget farctx/ALIAS."""
        models = registered()
        if models.pop(alias, None) is None:
            raise click.ClickException(f"no model farctx/{alias}")
        _registry_path().write_text(json.dumps(models, indent=2))


class _MethodOption(llm.Options):
    method: Optional[str] = Field(None, description=f"attention method (default {DEFAULT_METHOD}): "
                                                    f"{', '.join(farctx.METHODS)}")

    @field_validator("method")
    @classmethod
    def known_method(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and value not in farctx.METHODS:
            raise ValueError(f"unknown method '{value}' (choose from {', '.join(farctx.METHODS)})")
        return value


def _options() -> type[llm.Options]:
    """llm's -o options: the method, one per row of libfarctx's parameter table, and the run's own."""
    from farctx.methods import method_names, param_infos

    methods = method_names()
    fields: dict[str, Any] = {
        p.name: (Optional[int], Field(None, ge=p.minimum, description=p.option_help(methods))) for p in param_infos()
    }
    for o in option_infos():  # the runtime options table's that a chat may set, by llama.cpp's names
        if o.plugin:
            fields[o.name] = (Optional[bool] if o.kind == "switch" else Optional[int],
                              Field(None, ge=o.minimum, description=o.help))
    fields.update(
        max_tokens=(Optional[int], Field(None, ge=1, description="most tokens to generate")),
        temperature=(Optional[float], Field(None, ge=0, description="0: greedy")),
        seed=(Optional[int], Field(None, description="sampling seed")),
    )
    return create_model("Options", __base__=_MethodOption, **fields)


_METHOD_FIELDS = ("method", *farctx.MethodParams.names())
_TEMPLATE_TOKENS = 16  # a chat template's tokens around one message, counted generously
_RUNTIME_FIELDS = tuple(o.name for o in option_infos() if o.plugin)


class FarctxModel(llm.Model):
    can_stream = True

    Options = _options()

    def __init__(self, model_id: str, path: str) -> None:
        self.model_id = model_id
        self.path = path
        self._llm: Any = None
        self._loaded: Optional[dict[str, Any]] = None
        self._vocab: Any = None

    def _engine(self, kwargs: dict[str, Any], n_prompt: int, n_predict: int) -> Any:
        """farctx.Llama for these options (the method, its parameters, n_ctx), loaded again when they change;
        its cache sized as every farctx command sizes it (the context plan). With n_ctx unset, a conversation of
        n_prompt tokens + n_predict gets a cache that holds it, as `farctx generate` sizes one for its prompt: a
        document past the trained context is read (auto), not refused."""
        sized = "n_ctx" not in kwargs and not fixed_cache(kwargs.get("method", DEFAULT_METHOD))
        if self._loaded != kwargs or (sized and self._llm.n_ctx() < n_prompt + n_predict):
            if self._llm is not None:
                self._llm.close()
                self._llm, self._loaded = None, None
            extra = dict(n_prompt=n_prompt, n_predict=n_predict) if sized else {}
            self._llm = farctx.Llama(self.path, **kwargs, **extra)
            self._loaded = kwargs
        return self._llm

    def _count(self, messages: list[dict[str, str]]) -> int:
        """Tokens of the conversation, its chat template's own counted generously (the cache is sized from it)."""
        if self._vocab is None:
            self._vocab = farctx.Llama(self.path, vocab_only=True)
        text = "".join(m["content"] for m in messages)
        return len(self._vocab.tokenize(text.encode("utf-8"), add_bos=True)) + _TEMPLATE_TOKENS * len(messages)

    def execute(self, prompt: llm.Prompt, stream: bool, response: llm.Response,
                conversation: Optional[llm.Conversation]) -> Iterator[str]:
        options = prompt.options
        kwargs = {name: getattr(options, name) for name in (*_METHOD_FIELDS, *_RUNTIME_FIELDS)
                  if getattr(options, name) is not None}
        sampling = {name: getattr(options, name) for name in ("max_tokens", "temperature", "seed")
                    if getattr(options, name) is not None}
        messages = _messages(prompt, conversation)
        n_predict = sampling.get("max_tokens") or DEFAULT_GENERATION
        llm = self._engine(kwargs, self._count(messages), n_predict)
        for chunk in llm.create_chat_completion(messages=messages, stream=True, **sampling):
            piece = chunk["choices"][0]["delta"].get("content")
            if piece:
                yield piece


def _messages(prompt: llm.Prompt, conversation: Optional[llm.Conversation]) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    system = None
    for earlier in conversation.responses if conversation is not None else []:
        if earlier.prompt.system and earlier.prompt.system != system:
            system = earlier.prompt.system
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": earlier.prompt.prompt or ""})
        messages.append({"role": "assistant", "content": earlier.text()})
    if prompt.system and prompt.system != system:
        messages.append({"role": "system", "content": prompt.system})
    messages.append({"role": "user", "content": prompt.prompt or ""})
    return messages

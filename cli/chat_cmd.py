"""farctx chat: an interactive conversation in the terminal past the trained context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .options import llama_kwargs, method_options, model_option, runtime_options


@click.command()
@model_option()
@click.option("-sys", "--system-prompt", "--system", "system", default=None, help="system prompt")
@click.option("-f", "--file", default=None, metavar="FNAME",
              help="a document to load into the conversation first (prefixed to the first message)")
@click.option("-n", "--n-predict", "n_predict", type=int, default=-1, show_default=True,
              help="most tokens per answer (-1: until the model stops, or the cache is full)")
@click.option("--temp", type=click.FloatRange(0.0), default=0.8, show_default=True, help="temperature (0: greedy)")
@click.option("--seed", type=int, default=-1, show_default=True, help="sampling seed (-1: random)")
@click.option("--top-k", type=int, default=40, show_default=True)
@click.option("--top-p", type=float, default=0.95, show_default=True)
@runtime_options()
@method_options()
def chat(model: str | None, system: str | None, file: str | None, n_predict: int, temp: float, seed: int,
         top_k: int, top_p: float, **opts: Any) -> None:
    """Chat with the model, one line a message (/exit or end of input to stop).

    With the fixed-cache methods (lminf) the cache stays the same size however long the
    conversation runs, and the head every prompt starts with (BOS, the system prompt, the first
    user header) is the head the method keeps (lminf's --n-global, streaming's --n-sink) unless
    given. The other methods keep the whole conversation: -c sets their cache (default:
    n_ctx_train for auto and vanilla, 4 x n_ctx_train for mesa/selfextend/rerope/dca/string; auto, the
    default, reads past n_ctx_train when -c is larger).
    """
    import farctx
    from farctx.chat import Chat, fixed_head_tokens, run_chat
    from farctx.methods import method_infos
    from farctx.models import resolve_model_path

    document = None
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise click.BadParameter(f"no such file: {file}", param_hint="-f")
        document = path.read_text(encoding="utf-8", errors="replace")
    kwargs = llama_kwargs(opts)
    head = method_infos()[kwargs["method"]].head
    if head is not None and head not in kwargs:
        kwargs[head] = fixed_head_tokens(str(resolve_model_path(model)), system) or None
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    llm = farctx.Llama(model, **kwargs)  # loaded now: errors before the first message
    click.echo(f"farctx: {llm.method_params.describe()}, cache {llm.n_ctx()} cells", err=True)
    sampling: dict[str, Any] = {"temperature": temp, "top_k": top_k, "top_p": top_p,
                                "max_tokens": n_predict if n_predict > 0 else None}
    if seed >= 0:
        sampling["seed"] = seed
    run_chat(Chat(llm, system=system, document=document, sampling=sampling))

"""Train farctx's short-context test model (a ~5M-parameter llama, trained context 256) on the CPU.

    .venv/bin/pip install torch==2.13.0 tokenizers      # once; not part of the project's set-up
    .venv/bin/python tools/shortctx/train.py --out models/shortctx-256

Steps: build the corpus (corpus.py; Austen's Persuasion held out), train a 4096-token byte-level
BPE, train the model with bf16 autocast (a quarter of the rows are synthetic passkey prompts that
fit in 256 tokens, in exactly the format of `farctx eval passkey`, followed by the answer), export
an F16 GGUF, then load it in llama.cpp (farctx.Llama, vanilla, F32 cache) and compare its logits
with the torch model's past the trained context. Everything printed also goes to OUT/train.log.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import HELD_OUT, held_out_text, training_texts  # noqa: E402
from export import EOT, export, f16_rounded, torch_logits  # noqa: E402
from model import Config, ShortCtxLlama  # noqa: E402

from farctx.eval.passkey import make_sample, parse_answer  # noqa: E402


class Log:
    def __init__(self, path: Path, append: bool = False) -> None:
        self.fh: TextIO = open(path, "a" if append else "w")

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        self.fh.write(msg + "\n")
        self.fh.flush()


def train_tokenizer(texts: list[str], n_vocab: int, out: Path):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=n_vocab, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.save(str(out))
    return tok


class Batches:
    """Random 257-token rows of the corpus; a `passkey` share of them starts with a passkey prompt."""

    def __init__(self, data: torch.Tensor, n_ctx: int, passkey: float, count: Callable[[str], int],
                 encode: Callable[[str], list[int]], eot: int, seed: int) -> None:
        self.data, self.n_ctx, self.passkey = data, n_ctx, passkey
        self.count, self.encode, self.eot = count, encode, eot
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)

    def _corpus(self, n: int) -> torch.Tensor:
        start = int(torch.randint(0, len(self.data) - n, (1,), generator=self.gen))
        return self.data[start:start + n]

    def _row(self) -> torch.Tensor:
        n = self.n_ctx + 1
        if self.rng.random() >= self.passkey:
            return self._corpus(n)
        target = self.rng.randint(48, self.n_ctx - 12)
        sample = make_sample(target, None, self.rng, self.count)
        ids = self.encode(sample.text + f" {sample.key}.")[: n - 1] + [self.eot]
        return torch.cat([torch.tensor(ids, dtype=torch.long), self._corpus(n - len(ids))])

    def __call__(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self._row() for _ in range(batch)])
        return rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def val_loss(model: ShortCtxLlama, val: torch.Tensor, n_ctx: int, n_rows: int = 64) -> float:
    model.eval()
    starts = torch.linspace(0, len(val) - n_ctx - 2, n_rows).long()
    rows = torch.stack([val[s:s + n_ctx + 1] for s in starts])
    losses = []
    for chunk in rows.split(16):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(chunk[:, :-1])
        losses.append(F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten()).item())
    model.train()
    return float(np.mean(losses))


@torch.no_grad()
def passkey_accuracy(model: ShortCtxLlama, tok, n: int, length: int, seed: int) -> float:
    model.eval()
    rng = random.Random(seed)
    hits = 0
    for _ in range(n):
        sample = make_sample(length, None, rng, lambda s: len(tok.encode(s).ids))
        ids = tok.encode(sample.text).ids
        for _ in range(len(tok.encode(f" {sample.key}").ids) + 1):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
        hits += parse_answer(tok.decode(ids[-(len(tok.encode(f" {sample.key}").ids) + 1):])) == sample.key
    model.train()
    return hits / n


def check_in_llama(model: ShortCtxLlama, gguf_path: Path, ids: list[int], log: Log) -> float:
    import farctx

    llm = farctx.Llama(str(gguf_path), n_ctx=len(ids) + 64, type_k=0, type_v=0, n_threads=2, verbose=False)
    ours = np.asarray(llm.score(ids), dtype=np.float64)
    ref = torch_logits(f16_rounded(model), ids)
    diff = np.abs(ours - ref)
    agree = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    log(f"llama.cpp vs torch over {len(ids)} tokens (past n_ctx_train): max |diff| {diff.max():.4f}, "
        f"mean {diff.mean():.5f}, mean |logit| {np.abs(ref).mean():.3f}, argmax agreement {agree:.1%}")
    llm.close()
    return float(diff.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("models/shortctx-256"))
    ap.add_argument("--cache", type=Path, default=Path("build/shortctx"))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--passkey", type=float, default=0.3, help="share of rows that are passkey prompts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", type=Path, default=None,
                    help="continue from this checkpoint (a second phase: OUT's tokenizer, the log appended)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "train.log", append=args.resume is not None)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = Config()
    log(f"farctx short-context model: {cfg}; torch {torch.__version__}, {args.threads} threads; args {vars(args)}")

    t0 = time.time()
    texts = training_texts(args.cache)
    if args.resume is None:
        tok = train_tokenizer(texts, cfg.n_vocab, args.out / "tokenizer.json")
    else:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(args.out / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    ids = np.concatenate([np.asarray(tok.encode(t).ids + [eot], dtype=np.int64) for t in texts])
    chars = sum(len(t) for t in texts)
    log(f"corpus: {len(texts)} documents, {chars:,} chars, {len(ids):,} tokens ({chars / len(ids):.2f} chars/token), "
        f"held out: {HELD_OUT}; tokenizer + encoding {time.time() - t0:.0f} s")
    blocks = torch.from_numpy(ids[: len(ids) // 4096 * 4096].reshape(-1, 4096))
    is_val = torch.arange(len(blocks)) % 50 == 7  # every 50th block of 4096 tokens: validation
    train, val = blocks[~is_val].flatten(), blocks[is_val].flatten()

    model = ShortCtxLlama(cfg)
    if args.resume is not None:
        model.load_state_dict(torch.load(args.resume))
        log(f"resumed from {args.resume}")
    log(f"parameters: {sum(p.numel() for p in model.parameters()):,}; train {len(train):,} tokens, val {len(val):,}")
    batches = Batches(train, cfg.n_ctx_train, args.passkey, lambda s: len(tok.encode(s).ids),
                      lambda s: tok.encode(s).ids, eot, args.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    t_start = time.time()
    t_last = t_start
    for step in range(1, args.steps + 1):
        warm = min(1.0, step / args.warmup)
        lr = args.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batches(args.batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == 1:
            now = time.time()
            tps = (50 if step > 1 else 1) * args.batch * cfg.n_ctx_train / (now - t_last)
            t_last = now
            msg = f"step {step:5d}  loss {loss.item():.3f}  lr {lr:.2e}  {tps:,.0f} tok/s  {now - t_start:,.0f} s"
            if step % 200 == 0 or step == args.steps:
                vl = val_loss(model, val, cfg.n_ctx_train)
                msg += f"  val loss {vl:.3f} (ppl {math.exp(vl):.1f})"
            log(msg)
    log(f"training: {args.steps} steps x {args.batch} x {cfg.n_ctx_train} tokens in {time.time() - t_start:,.0f} s")
    torch.save(model.state_dict(), args.cache / ("model.pt" if args.resume is None else "model-resumed.pt"))

    acc = passkey_accuracy(model, tok, 50, 200, seed=123)
    log(f"passkey accuracy in torch, 50 prompts of <= 200 tokens (inside the trained context): {acc:.0%}")

    gguf_path = args.out / "shortctx-256-f16.gguf"
    export(model, args.out / "tokenizer.json", gguf_path, "farctx-shortctx-256")
    log(f"wrote {gguf_path} ({gguf_path.stat().st_size:,} bytes)")
    held = tok.encode(held_out_text()[:4000]).ids[:320]
    max_diff = check_in_llama(model, gguf_path, held, log)
    (args.out / "model.json").write_text(json.dumps({
        "config": cfg.__dict__, "steps": args.steps, "resumed": args.resume is not None, "batch": args.batch, "passkey_share": args.passkey,
        "held_out": HELD_OUT, "passkey_accuracy_torch_200": acc, "llama_vs_torch_max_abs_diff": max_diff,
    }, indent=1) + "\n")
    if max_diff > 0.1:
        raise SystemExit("llama.cpp disagrees with torch: the export is wrong")


if __name__ == "__main__":
    main()

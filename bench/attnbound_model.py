"""Write the benchmark's attention-bound model: random weights, llama architecture, trained context
2048, small matrices (n_embd 128, 4 layers) and a 4096-token vocabulary, so that attention, not the
weights, is what a long context costs. Speed does not depend on what the weights know; this makes
the scaling of each method visible at lengths the default model would need hours for on 2 cores.

    .venv/bin/python bench/attnbound_model.py OUT.gguf [TOKENIZER_GGUF]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tiny_gguf import TinyConfig, write_tiny_gguf  # noqa: E402

CONFIG = TinyConfig(n_ctx_train=2048, n_embd=128, n_layer=4, n_head=2, n_head_kv=1, n_ff=256, rope_base=10000.0)


def main() -> None:
    out = Path(sys.argv[1])
    tokenizer = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "models" / "shortctx-256" / "shortctx-256-f16.gguf"
    write_tiny_gguf(out, tokenizer, CONFIG)
    print(out)


if __name__ == "__main__":
    main()

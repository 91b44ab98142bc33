#!/usr/bin/env bash
# The quality table of docs/results.md on farctx's short-context model (trained context 256,
# models/shortctx-256, tools/shortctx/train.py): perplexity of Austen's Persuasion (held out of its
# training) and passkey retrieval, 0.5x to 32x / 16x the trained context, every method.
# Outputs in bench/results/quality/: <kind>-shortctx-256.{md,json,png}.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=bench/results/quality
mkdir -p "$out" build/quality
model=models/shortctx-256/shortctx-256-f16.gguf
methods=all
text=build/quality/persuasion.txt
.venv/bin/python -c "from farctx.eval.data import austen; open('$text', 'w').write(austen('persuasion'))"
cmd=(eval ppl -m "$model" -f "$text" --methods "$methods" --lengths 128,256,512,1k,2k,4k,8k --window 64 --docs 8 -t 2
     --json "$out/ppl-shortctx-256.json" --plot "$out/ppl-shortctx-256.png")
echo "\$ farctx ${cmd[*]}" > "$out/ppl-shortctx-256.md"
.venv/bin/farctx "${cmd[@]}" >> "$out/ppl-shortctx-256.md"
cmd=(eval passkey -m "$model" --methods "$methods" --lengths 128,256,512,1k,2k,4k --samples 10 --seed 1 -t 2
     --json "$out/passkey-shortctx-256.json" --plot "$out/passkey-shortctx-256.png")
echo "\$ farctx ${cmd[*]}" > "$out/passkey-shortctx-256.md"
.venv/bin/farctx "${cmd[@]}" >> "$out/passkey-shortctx-256.md"

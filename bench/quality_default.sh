#!/usr/bin/env bash
# The quality table on the bundled default model (SmolLM2-135M-Instruct, trained context 8192), 4k to
# 32k tokens, every method. Outputs in bench/results/quality/: <kind>-SmolLM2-135M-Instruct.*
# Cost: each 32k pass of a whole-cache method (vanilla, selfextend, rerope) is ~40 min of prefill on
# 2 CPU cores (rerope ~2x), each fixed-cache method ~20 min, mesa a new prompt per length; passkey
# runs one prompt per sample and length. About 10 hours on 2 cores in all; minutes on a GPU
# (pass -ngl 99 through FARCTX_EXTRA, e.g. FARCTX_EXTRA="-ngl 99 -fa on").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=bench/results/quality
mkdir -p "$out" build/quality
name=SmolLM2-135M-Instruct
methods=${METHODS:-all}
text=build/quality/persuasion.txt
.venv/bin/python -c "from farctx.eval.data import austen; open('$text', 'w').write(austen('persuasion'))"
# shellcheck disable=SC2206
extra=(${FARCTX_EXTRA:--t 2})
cmd=(eval ppl -f "$text" --methods "$methods" --lengths 4k,8k,16k,32k --window 256 --docs 1 "${extra[@]}"
     --json "$out/ppl-$name.json" --plot "$out/ppl-$name.png")
echo "\$ farctx ${cmd[*]}" > "$out/ppl-$name.md"
.venv/bin/farctx "${cmd[@]}" >> "$out/ppl-$name.md"
cmd=(eval passkey --methods "$methods" --lengths 4k,8k,16k,32k --samples 5 --seed 1 "${extra[@]}"
     --json "$out/passkey-$name.json" --plot "$out/passkey-$name.png")
echo "\$ farctx ${cmd[*]}" > "$out/passkey-$name.md"
.venv/bin/farctx "${cmd[@]}" >> "$out/passkey-$name.md"

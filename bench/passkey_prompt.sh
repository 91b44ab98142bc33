#!/usr/bin/env bash
# Passkey retrieval past the trained context (the LM-Infinite / Mesa protocol): a key in [1, 10^7)
# at 50% depth inside ~16,500 tokens of filler (2x the default model's 8192), then
# "What is the pass key? The pass key is"; 8 greedy tokens with mesa and with vanilla (cache
# enlarged to fit). Outputs land in bench/results/passkey-2x/. METHODS="mesa" runs one of them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/bench/results/passkey-2x"
mkdir -p "$out"
"$root/.venv/bin/python" - "$out/prompt.txt" <<'PY'
import random
import sys
import farctx

rng = random.Random(1)
key = rng.randrange(1, 10**7)
prefix = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
          "I will quiz you about the important information there.\n")
filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
question = "What is the pass key? The pass key is"
llm = farctx.Llama(n_ctx=256)
def build(n_fill):
    half = n_fill // 2
    return prefix + filler * half + needle + filler * (n_fill - half) + question

n_fill = 16500 // len(llm.tokenize(filler.encode(), add_bos=False))
while len(llm.tokenize(build(n_fill).encode())) < 16500:  # past 2 x 8192
    n_fill += 10
text = build(n_fill)
open(sys.argv[1], "w").write(text)
print(key, len(llm.tokenize(text.encode())))
PY
for method in ${METHODS:-mesa vanilla}; do
    extra=()
    [ "$method" = vanilla ] && extra=(-c 17152)
    cmd=(farctx generate -f bench/results/passkey-2x/prompt.txt -n 8 --temp 0 --seed 1 -t 2 --method "$method" --json "${extra[@]}")
    echo "\$ ${cmd[*]}" > "$out/$method.txt"
    ( cd "$root" && /usr/bin/time -f "%e s wall, %M KiB max RSS" ".venv/bin/${cmd[0]}" "${cmd[@]:1}" ) >> "$out/$method.txt" 2>&1
done

#!/usr/bin/env bash
# A prompt past 4x the default model's trained context (8192): the first ~34k tokens of Emma,
# then 64 greedy tokens with lminf (a 8714-cell cache, constant) and with vanilla (a cache
# enlarged to hold the whole prompt). Outputs land in bench/long-prompt/.
# METHODS="vanilla" runs one of the two.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/bench/long-prompt"
mkdir -p "$out"
"$root/.venv/bin/python" - "$out/prompt.txt" <<'PY'
import sys
import farctx
from farctx.data import austen
text = austen("emma")
llm = farctx.Llama(n_ctx=256)
words = text.split(" ")
lo, hi = 0, len(words)
while lo < hi:  # the shortest prefix of whole words past 34,000 tokens
    mid = (lo + hi) // 2
    if len(llm.tokenize(" ".join(words[:mid]).encode())) < 34000:
        lo = mid + 1
    else:
        hi = mid
open(sys.argv[1], "w").write(" ".join(words[:lo]))
PY
for method in ${METHODS:-lminf vanilla}; do
    extra=()
    [ "$method" = vanilla ] && extra=(-c 34304 -fa on)
    cmd=(farctx generate -f bench/long-prompt/prompt.txt -n 64 --temp 0 --seed 1 -t 2 --method "$method" --json "${extra[@]}")
    echo "\$ ${cmd[*]}" > "$out/$method.txt"
    ( cd "$root" && /usr/bin/time -f "%e s wall, %M KiB max RSS" ".venv/bin/${cmd[0]}" "${cmd[@]:1}" ) >> "$out/$method.txt" 2>&1
done

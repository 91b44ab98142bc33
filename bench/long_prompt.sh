#!/usr/bin/env bash
# A prompt past 4x the default model's trained context (8192): the first ~34k tokens of Emma,
# then 64 greedy tokens with lminf (a 8714-cell cache, constant) and with vanilla (a cache
# enlarged to hold the whole prompt). Outputs land in bench/results/long-prompt-4x/.
# METHODS="vanilla" runs one of the two.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/bench/results/long-prompt-4x"
mkdir -p "$out"
"$root/.venv/bin/python" "$root/bench/austen_prompt.py" "$out/prompt.txt" 34000
for method in ${METHODS:-lminf vanilla}; do
    extra=()
    [ "$method" = vanilla ] && extra=(-c 34304 -fa on)
    cmd=(farctx generate -f bench/results/long-prompt-4x/prompt.txt -n 64 --temp 0 --seed 1 -t 2 --method "$method" --json "${extra[@]}")
    echo "\$ ${cmd[*]}" > "$out/$method.txt"
    ( cd "$root" && /usr/bin/time -f "%e s wall, %M KiB max RSS" ".venv/bin/${cmd[0]}" "${cmd[@]:1}" ) >> "$out/$method.txt" 2>&1
done

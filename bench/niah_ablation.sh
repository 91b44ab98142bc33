#!/usr/bin/env bash
# Which part of the needle-in-a-haystack protocol decides whether the default model answers: one factor changed
# at a time from the base (Emma, the needle on its own line, a 5-digit key, the question with its answer's start,
# raw text), each at 1x the trained context with vanilla and at 2x with an extension (EXT, default dca); depths
# 10/50/90%, SAMPLES per cell (default 1). Resumable: a configuration's JSON keeps what has run.
# Outputs: bench/results/niah/ablation/<config>.json and ablation.md (the table).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=bench/results/niah/ablation
mkdir -p "$out"
ext=${EXT:-dca}
samples=${SAMPLES:-1}
common=(--depths 0.1,0.5,0.9 --samples "$samples" --seed 1 -t "${THREADS:-2}" -fa on)
declare -A configs=(
    [base]=""
    [repeat]="--haystack repeat"
    [hamlet]="--haystack shakespeare:hamlet"
    [inline]="--placement inline"
    [digits7]="--digits 7"
    [bare]="--question bare"
    [chat]="--chat"
)
order=(base repeat hamlet inline digits7 bare chat)
run() {  # config, method, length
    # shellcheck disable=SC2086
    .venv/bin/farctx eval niah --methods "$2" --lengths "$3" ${configs[$1]} "${common[@]}" \
        --json "$out/$1.json" > /dev/null 2>> "$out/log.txt"
}
for stage in "vanilla 8k" "$ext 16k"; do
    for c in "${order[@]}"; do
        # shellcheck disable=SC2086
        echo "$(date -u +%H:%M:%S) $c $stage" >> "$out/log.txt"
        run "$c" $stage
    done
done
.venv/bin/python bench/niah_table.py "$out"/*.json > "$out/ablation.md"

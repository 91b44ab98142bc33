#!/usr/bin/env bash
# Which part of the needle-in-a-haystack protocol decides whether the default model answers: one factor changed
# at a time from the base (Emma, the needle on its own line, a 5-digit key, the question with its answer's start,
# raw text), each at 1x the trained context with vanilla and at 2x with an extension (dca); depths 10/50/90%, one
# sample per cell; then the length (4k), and the chat template with the repeated filler and with RULER's word-value
# needle (the pairs the first round suggested); last, the word-value needle in the repeated filler (RULER's
# niah_single_1 form), 3 samples per depth inside the trained context. Each configuration keeps its
# samples in its JSON, so the script resumes where it stopped; RUNS="chat:vanilla:8k ..." runs some.
# Outputs: bench/results/niah/ablation/<config>.json, log.txt, and ablation.md (the table and every wrong answer).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=bench/results/niah/ablation
mkdir -p "$out"
# the base spelled out, so that the configurations stay what they were if a default of `farctx eval niah` changes;
# a configuration's flags come after it and override it
base=(--kind passkey --haystack austen:emma --placement line --digits 5 --question cue)
common=(--depths 0.1,0.5,0.9 --seed 1 -t "${THREADS:-2}" -fa on)
declare -A configs=(
    [base]="--raw"
    [repeat]="--raw --haystack repeat"
    [hamlet]="--raw --haystack shakespeare:hamlet"
    [inline]="--raw --placement inline"
    [digits7]="--raw --digits 7"
    [bare]="--raw --question bare"
    [chat]="--chat"
    [chat-repeat]="--chat --haystack repeat"
    [chat-word]="--chat --kind word-value"
    [chat-word-repeat]="--chat --kind word-value --haystack repeat"
)
# config:method:length[:samples], in the order they run (the most telling first)
default_runs="base:vanilla:8k repeat:vanilla:8k hamlet:vanilla:8k inline:vanilla:8k digits7:vanilla:8k
    bare:vanilla:8k chat:vanilla:8k chat:dca:16k base:dca:16k chat-repeat:vanilla:8k chat:vanilla:4k base:vanilla:4k
    chat-word:vanilla:8k chat-word:dca:16k repeat:dca:16k inline:dca:16k hamlet:dca:16k digits7:dca:16k
    bare:dca:16k chat-word-repeat:vanilla:8k:3 chat-word-repeat:vanilla:4k:3 chat-word-repeat:dca:16k"
for run in ${RUNS:-$default_runs}; do
    IFS=: read -r c method length samples <<< "$run"
    echo "$(date -u +%H:%M:%S) $c $method $length" >> "$out/log.txt"
    # shellcheck disable=SC2086
    .venv/bin/farctx eval niah --methods "$method" --lengths "$length" --samples "${samples:-1}" "${base[@]}" \
        ${configs[$c]} "${common[@]}" --json "$out/$c.json" > /dev/null 2>> "$out/log.txt"
done
.venv/bin/python bench/niah_table.py "$out"/*.json > "$out/ablation.md"

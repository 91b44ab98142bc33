#!/usr/bin/env bash
# The default model's needle-in-a-haystack grid on the CPU, in the default protocol of `farctx eval niah`
# (docs/evaluation.md): lengths 4k, 8k (1x), 16k (2x), 32k (4x); depths 10/50/90%; 3 samples per cell up to 16k,
# 1 at 32k; vanilla from 2k (0.25x) to 8k and one 16k cell; selfextend, dca, mesa, rerope and lminf. Hours on 2
# cores: it runs in stages (the cells that answer the goals first, the longest last), each resumable from the JSON,
# which keeps every sample; STAGES=1,2 runs some. At the end, and with REPORT=1 at any time: grid.md (table,
# effective lengths) and grid.png (the heat maps) from what the JSON holds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=bench/results/niah
mkdir -p "$out"
json=$out/grid-SmolLM2-135M-Instruct.json
# the default protocol (docs/evaluation.md), spelled out so that the grid stays one protocol if a default changes
protocol=(--kind word-value --haystack austen:emma --placement line --digits 5 --question cue --chat --seed 1)
common=("${protocol[@]}" --depths 0.1,0.5,0.9 -t "${THREADS:-2}" -fa on --json "$json")
niah() { .venv/bin/farctx eval niah "$@" "${common[@]}" > /dev/null 2>> "$out/grid-log.txt"; }
stage() {  # number, methods, lengths, samples [depths]
    case ",${STAGES:-1,2,3,4,5,6,7}," in *",$1,"*) ;; *) return 0;; esac
    echo "$(date -u +%H:%M:%S) stage $1: $2 at $3, $4 per cell" >> "$out/grid-log.txt"
    if [ -n "${5:-}" ]; then
        .venv/bin/farctx eval niah --methods "$2" --lengths "$3" --samples "$4" "${protocol[@]}" --depths "$5" \
            -t "${THREADS:-2}" -fa on --json "$json" > /dev/null 2>> "$out/grid-log.txt"
    else
        niah --methods "$2" --lengths "$3" --samples "$4"
    fi
}
if [ "${REPORT:-0}" != 1 ]; then
    stage 1 vanilla 4k,8k 3
    stage 1 vanilla 16k 1 0.5
    stage 2 dca,selfextend 16k 3
    stage 3 mesa,rerope,lminf 16k 3
    stage 4 dca,selfextend 32k 1
    stage 5 selfextend,dca,mesa,rerope,lminf 4k,8k 3
    stage 6 mesa,rerope,lminf 32k 1
    stage 7 vanilla 2k 3
fi
methods=vanilla,selfextend,dca,mesa,rerope,lminf
lengths=2k,4k,8k,16k,32k
{
    echo "\$ bench/niah_grid.sh   # this report: commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d); when each stage ran: grid-log.txt"
    echo "\$ farctx eval niah --methods $methods --lengths $lengths --samples 3 ${common[*]} --report-only --plot $out/grid-SmolLM2-135M-Instruct.png"
    .venv/bin/farctx eval niah --methods "$methods" --lengths "$lengths" --samples 3 "${common[@]}" \
        --report-only --plot "$out/grid-SmolLM2-135M-Instruct.png"
} > "$out/grid-SmolLM2-135M-Instruct.md"

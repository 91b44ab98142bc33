#!/usr/bin/env bash
# Issue 16: LM-Infinite and StreamingLLM past n_local through flash attention, a before/after pair of
# `farctx bench` runs on the attention-bound model (bench/attnbound_model.py, n_ctx_train 2048), each with
# `window` (one segment, the same work minus the head tokens) in the same run, and the ratios to it.
#   bench/perf/seg2_fa.sh    patch 0012 (prefill: per-query key copies; decode: the head keys rotated into free
#                            cache cells) against FARCTX_PER_QUERY_SEG2=0 FARCTX_DISPLAY_CELLS=0 (the two-segment
#                            softmax, a concatenated copy of the cells); since 0016 only FARCTX_SEG2_LSE=0 shows
#                            0012 on the CPU. About 6 minutes on 2 cores. Outputs: bench/perf/seg2-fa/.
#   bench/perf/seg2_lse.sh   patch 0016 (two flash-attention calls merged by log-sum-exp) against
#                            FARCTX_SEG2_LSE=0; vanilla too. About 15 minutes. Outputs: bench/perf/seg2-lse/.
# Environment: OUT, METHODS, BEFORE, AFTER (the variants' settings), REPS (5).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-bench/perf/seg2-fa}
mkdir -p "$out" build/bench
model=build/bench/attnbound-2k.gguf
[ -f "$model" ] || .venv/bin/python bench/attnbound_model.py "$model" >/dev/null
args=(--model "$model" --methods "${METHODS:-window,lminf,streaming}" --lengths 2k,8k,32k --reps "${REPS:-5}" -n 64
      -t 2 -fa on --stock-max 2048)
for variant in before after; do
    if [ "$variant" = before ]; then
        read -r -a env <<< "${BEFORE:-FARCTX_PER_QUERY_SEG2=0 FARCTX_DISPLAY_CELLS=0}"
    else
        read -r -a env <<< "${AFTER:-FARCTX_DISPLAY_CELLS=1}"
    fi
    echo "\$ ${env[*]} farctx bench ${args[*]}" > "$out/$variant.md"
    env "${env[@]}" .venv/bin/python -m farctx.cli.main bench "${args[@]}" --json "$out/$variant.json" \
        --plot "$out/$variant.png" >> "$out/$variant.md"
done
.venv/bin/python bench/perf/seg2_ratios.py "$out/before.json" "$out/after.json" > "$out/ratios.md"
cat "$out/ratios.md"

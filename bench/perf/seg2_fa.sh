#!/usr/bin/env bash
# Issue 16: LM-Infinite and StreamingLLM past n_local through flash attention, patch 0012 (prefill: the second
# segment as per-query key copies; decode: its keys rotated into free cache cells, no copy of the cells) against
# what it replaces (FARCTX_PER_QUERY_SEG2=0 FARCTX_DISPLAY_CELLS=0: the two-segment softmax for prefill, a
# concatenated copy of the cells for decode), each with `window` (one segment, the same work minus the head
# tokens) in the same run. Attention-bound
# model (bench/attnbound_model.py, n_ctx_train 2048). About 6 minutes on 2 cores. Outputs: bench/perf/seg2-fa/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=bench/perf/seg2-fa
mkdir -p "$out" build/bench
model=build/bench/attnbound-2k.gguf
[ -f "$model" ] || .venv/bin/python bench/attnbound_model.py "$model" >/dev/null
args=(--model "$model" --methods window,lminf,streaming --lengths 2k,8k,32k --reps "${REPS:-5}" -n 64 -t 2
      -fa on --stock-max 2048)
for variant in before after; do
    if [ "$variant" = before ]; then env=(FARCTX_PER_QUERY_SEG2=0 FARCTX_DISPLAY_CELLS=0); else env=(FARCTX_DISPLAY_CELLS=1); fi
    echo "\$ ${env[*]} farctx bench ${args[*]}" > "$out/$variant.md"
    env "${env[@]}" .venv/bin/python -m farctx.cli.main bench "${args[@]}" --json "$out/$variant.json" \
        --plot "$out/$variant.png" >> "$out/$variant.md"
done
.venv/bin/python bench/perf/seg2_ratios.py "$out/before.json" "$out/after.json" > "$out/ratios.md"
cat "$out/ratios.md"

#!/usr/bin/env bash
# Issue 16: LM-Infinite and StreamingLLM past n_local on the CPU with flash attention. Patch 0016 (default): the
# head tokens (globals, sinks) and the cells each through a flash-attention call that also returns its rows'
# log-sum-exp (patch 0015), merged exactly; against FARCTX_SEG2_LSE=0, patch 0012's paths (per-query key copies
# up to 8 head tokens, else the two-segment softmax, for prefill; free cells for decode). `window` (one segment,
# the same work minus the head tokens) and `vanilla` in the same run. Attention-bound model
# (bench/attnbound_model.py, n_ctx_train 2048), medians of REPS (5). About 15 minutes on 2 cores.
# Outputs: bench/perf/seg2-lse/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=bench/perf/seg2-lse
mkdir -p "$out" build/bench
model=build/bench/attnbound-2k.gguf
[ -f "$model" ] || .venv/bin/python bench/attnbound_model.py "$model" >/dev/null
args=(--model "$model" --methods window,lminf,streaming,vanilla --lengths 2k,8k,32k --reps "${REPS:-5}" -n 64 -t 2
      -fa on --stock-max 2048)
for variant in before after; do
    if [ "$variant" = before ]; then env=(FARCTX_SEG2_LSE=0); else env=(FARCTX_SEG2_LSE=1); fi
    echo "\$ ${env[*]} farctx bench ${args[*]}" > "$out/$variant.md"
    env "${env[@]}" .venv/bin/python -m farctx.cli.main bench "${args[@]}" --json "$out/$variant.json" \
        --plot "$out/$variant.png" >> "$out/$variant.md"
done
.venv/bin/python bench/perf/seg2_ratios.py "$out/before.json" "$out/after.json" > "$out/ratios.md"
cat "$out/ratios.md"

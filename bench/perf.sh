#!/usr/bin/env bash
# The speed runs of docs/results.md: stock llama.cpp interleaved with farctx in the same
# run, medians of --reps, outputs in bench/results/speed/ (<name>.json, .md, .png). About 30-45 minutes on 2 cores.
#   1. the default model (SmolLM2-135M-Instruct, n_ctx_train 8192), every method at lengths inside the
#      trained context: the "within 3% of stock" target;
#   2. an attention-bound random model (bench/attnbound_model.py: n_ctx_train 2048, small matrices), where a
#      long context costs what it costs a real model at 8k-32k: lminf at 1x-16x n_ctx_train (decode and
#      prefill against their value at 1x, KV bytes flat) and mesa against vanilla at 4x (-fa on).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=bench/results/speed
mkdir -p "$out" build/bench
farctx=.venv/bin/farctx
run() {  # name, farctx bench arguments...
    local name=$1; shift
    echo "\$ farctx bench $*" > "$out/$name.md"
    "$farctx" bench "$@" --json "$out/$name.json" --plot "$out/$name.png" >> "$out/$name.md"
}
run default-model-inside-context --methods vanilla,lminf,window,lambda-only,streaming,rerope,selfextend,mesa \
    --lengths 1k,2k --reps 3 -n 16 -t 2
model=build/bench/attnbound-2k.gguf
[ -f "$model" ] || .venv/bin/python bench/attnbound_model.py "$model" >/dev/null
run attnbound-1x-16x --model "$model" --methods vanilla,lminf,mesa --lengths 2k,8k,32k --reps 3 -n 32 -t 2 -fa on
# the decode and prefill scaling of lminf, and mesa against vanilla at 4x, with longer decodes
run attnbound-1x-16x-long-decode --model "$model" --methods vanilla,lminf,mesa --lengths 2k,8k,32k --reps 5 -n 256 -t 2 -fa on --stock-max 8192
# mesa against vanilla and stock at 4x alone, 15 repetitions (the 2x target sits inside the scatter of
# 5), with the paired per-repetition ratios
name=attnbound-mesa-prefill-4x
echo "\$ farctx bench --model $model --methods vanilla,mesa --lengths 8k --reps 15 -n 4 -t 2 -fa on" > "$out/$name.md"
"$farctx" bench --model "$model" --methods vanilla,mesa --lengths 8k --reps 15 -n 4 -t 2 -fa on \
    --json "$out/$name.json" >> "$out/$name.md" 2> build/bench/$name.log
.venv/bin/python bench/paired_ratios.py build/bench/$name.log mesa >> "$out/$name.md"

#!/usr/bin/env bash
# The measurements behind `--method auto` (docs/methods.md, "Why auto is what it is") on the default model: the two
# shapes the choice was between, at 2x and 4x its trained context (8192), beside selfextend and dca's own cells of
# bench/niah_grid.sh (the same protocol, samples and seed):
#   (a) dca with chunk_size = n_ctx_train, stock by construction up to n_ctx_train + 1 tokens;
#   (b) stock for every query before n_ctx_train, dca's default chunk (3/4 of it) from there on: auto with
#       --chunk-size 6144, auto's default before (a) was measured;
# and auto itself, whose default chunk is now n_ctx_train, (a)'s rule exactly, at 4x with three samples per depth.
# Steps (STEPS=niah-a,... runs some; a step whose output exists is skipped, and the needle cells resume from their
# JSON): the needle cells of both shapes at 16k (niah-a, niah-b) and 32k (niah-a4, niah-b4), auto's at 32k
# (niah-auto4); perplexity at
# 0.5x/1x/2x for vanilla, auto, dca and selfextend (ppl) and for shape (a) (ppl-a), at 1x/4x for auto and dca
# (ppl4) and for shape (a) (ppl4-a); speed against vanilla at 1x/4x/16x on the attention-bound random model (speed:
# auto as (b), speed-default: auto's default, (a)).
# Outputs in bench/results/niah/auto/ and bench/results/auto/. Hours on 2 cores (the needle cells most of it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
niah_out=bench/results/niah/auto
out=bench/results/auto
mkdir -p "$niah_out" "$out"
protocol=(--kind word-value --haystack austen:emma --placement line --digits 5 --question cue --chat --seed 1
          --depths 0.1,0.5,0.9 -t "${THREADS:-2}" -fa on)
all_steps=niah-a,niah-b,ppl,ppl-a,speed,niah-a4,niah-b4,ppl4,ppl4-a,niah-auto4,speed-default
want() { case ",${STEPS:-$all_steps}," in *",$1,"*) return 0;; *) return 1;; esac; }
report() {  # file, command...: the command, then what it prints
    local file=$1; shift
    { echo "\$ $*"; "$@"; } > "$file.tmp" && mv "$file.tmp" "$file"
}
farctx=.venv/bin/farctx
# a shape's needle cells: 3 samples per depth at 2x, 1 at 4x (as bench/niah_grid.sh; SAMPLES4 more), then its report
niah_shape() {  # name, step at 2x, step at 4x, method flags...
    local name=$1 two=$2 four=$3; shift 3
    local json=$niah_out/$name-SmolLM2-135M-Instruct.json
    if want "$two"; then
        $farctx eval niah "$@" --lengths 16k --samples 3 "${protocol[@]}" --json "$json" > /dev/null \
            2>> "$niah_out/log.txt"
    fi
    if want "$four"; then
        $farctx eval niah "$@" --lengths 32k --samples "${SAMPLES4:-1}" "${protocol[@]}" --json "$json" > /dev/null \
            2>> "$niah_out/log.txt"
    fi
    if want "$two" || want "$four"; then
        report "$niah_out/$name-SmolLM2-135M-Instruct.md" $farctx eval niah "$@" --lengths 16k,32k --samples 3 \
            "${protocol[@]}" --json "$json" --report-only --plot "$niah_out/$name-SmolLM2-135M-Instruct.png"
    fi
}
niah_shape dca-chunk8192 niah-a niah-a4 --methods dca --chunk-size 8192
niah_shape auto niah-b niah-b4 --methods auto --chunk-size 6144
SAMPLES4=${SAMPLES4:-3} niah_shape auto-default none niah-auto4 --methods auto
if want ppl && [ ! -f "$out/ppl-SmolLM2-135M-Instruct.md" ]; then
    report "$out/ppl-SmolLM2-135M-Instruct.md" $farctx eval ppl --methods vanilla,auto,dca,selfextend \
        --lengths 4k,8k,16k -t "${THREADS:-2}" -fa on --json "$out/ppl-SmolLM2-135M-Instruct.json" \
        --plot "$out/ppl-SmolLM2-135M-Instruct.png"
fi
if want ppl-a && [ ! -f "$out/ppl-dca-chunk8192-SmolLM2-135M-Instruct.md" ]; then
    report "$out/ppl-dca-chunk8192-SmolLM2-135M-Instruct.md" $farctx eval ppl --methods dca --chunk-size 8192 \
        --lengths 4k,8k,16k -t "${THREADS:-2}" -fa on --json "$out/ppl-dca-chunk8192-SmolLM2-135M-Instruct.json"
fi
if want ppl4 && [ ! -f "$out/ppl-4x-SmolLM2-135M-Instruct.md" ]; then
    report "$out/ppl-4x-SmolLM2-135M-Instruct.md" $farctx eval ppl --methods auto,dca --lengths 8k,32k \
        -t "${THREADS:-2}" -fa on --json "$out/ppl-4x-SmolLM2-135M-Instruct.json"
fi
if want ppl4-a && [ ! -f "$out/ppl-4x-dca-chunk8192-SmolLM2-135M-Instruct.md" ]; then
    report "$out/ppl-4x-dca-chunk8192-SmolLM2-135M-Instruct.md" $farctx eval ppl --methods dca --chunk-size 8192 \
        --lengths 8k,32k -t "${THREADS:-2}" -fa on --json "$out/ppl-4x-dca-chunk8192-SmolLM2-135M-Instruct.json"
fi
if want speed-default && [ ! -f "$out/speed-auto-default-attnbound-1x-4x-16x.md" ]; then
    model=build/bench/attnbound-2k.gguf
    [ -f "$model" ] || .venv/bin/python bench/attnbound_model.py "$model" > /dev/null
    report "$out/speed-auto-default-attnbound-1x-4x-16x.md" $farctx bench --model "$model" --methods vanilla,auto,dca \
        --lengths 2k,8k,32k --reps 3 -n 64 -t 2 -fa on --json "$out/speed-auto-default-attnbound-1x-4x-16x.json" \
        --plot "$out/speed-auto-default-attnbound-1x-4x-16x.png"
fi
if want speed && [ ! -f "$out/speed-attnbound-1x-4x-16x.md" ]; then
    model=build/bench/attnbound-2k.gguf
    [ -f "$model" ] || .venv/bin/python bench/attnbound_model.py "$model" > /dev/null
    report "$out/speed-attnbound-1x-4x-16x.md" $farctx bench --model "$model" --methods vanilla,auto,dca \
        --lengths 2k,8k,32k --reps 3 -n 64 -t 2 -fa on --json "$out/speed-attnbound-1x-4x-16x.json" \
        --plot "$out/speed-attnbound-1x-4x-16x.png"
fi

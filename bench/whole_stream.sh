#!/usr/bin/env bash
# The whole-stream family's speed and memory against vanilla (issue: SelfExtend and ReRoPE decode like dca): every
# method that keeps every key (selfextend, rerope, string, dca, mesa), at 4x and 16x the attention-bound model's
# trained context (2048), paired rounds against vanilla and stock llama.cpp in the same run, RSS and KV beside each
# row; then the default model at 4x an assumed 2,048-token context, where the layers' own work is what a real model
# pays; STRING where its claim lives, inside the trained context: its speed at 1x (attention-bound model) and its
# perplexity at 0.5x/1x/2x beside vanilla and selfextend (default model). Steps (STEPS=attnbound,default,string-1x,
# string-ppl runs some; a step whose output exists is skipped). Outputs in bench/results/whole-stream/. About 12,
# 25, 2 and 12 minutes on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=bench/results/whole-stream
mkdir -p "$out"
want() { case ",${STEPS:-attnbound,default,string-1x,string-ppl}," in *",$1,"*) return 0;; *) return 1;; esac; }
report() {  # file, command...: the command, then what it prints
    local file=$1; shift
    { echo "\$ $*"; "$@"; } > "$file.tmp" && mv "$file.tmp" "$file"
}
farctx=.venv/bin/farctx
methods=vanilla,selfextend,rerope,string,dca,mesa
if want attnbound && [ ! -f "$out/speed-attnbound-4x-16x.md" ]; then
    model=build/bench/attnbound-2k.gguf
    [ -f "$model" ] || .venv/bin/python bench/attnbound_model.py "$model" > /dev/null
    report "$out/speed-attnbound-4x-16x.md" $farctx bench --model "$model" --methods "$methods" --lengths 8k,32k \
        --reps "${REPS:-3}" -n 64 -t "${THREADS:-2}" -fa on --json "$out/speed-attnbound-4x-16x.json" \
        --plot "$out/speed-attnbound-4x-16x.png"
fi
if want default && [ ! -f "$out/speed-default-assumed2k-4x.md" ]; then
    report "$out/speed-default-assumed2k-4x.md" $farctx bench --methods vanilla,selfextend,rerope,string \
        --n-ctx-train 2048 --lengths 8k --reps "${REPS:-3}" -n 32 -t "${THREADS:-2}" -fa on \
        --json "$out/speed-default-assumed2k-4x.json"
fi
if want string-1x && [ ! -f "$out/speed-string-attnbound-1x.md" ]; then
    model=build/bench/attnbound-2k.gguf
    [ -f "$model" ] || .venv/bin/python bench/attnbound_model.py "$model" > /dev/null
    report "$out/speed-string-attnbound-1x.md" $farctx bench --model "$model" --methods vanilla,string --lengths 2k \
        --reps "${REPS:-3}" -n 64 -t "${THREADS:-2}" -fa on --json "$out/speed-string-attnbound-1x.json"
fi
if want string-ppl && [ ! -f "$out/ppl-string-SmolLM2-135M-Instruct.md" ]; then
    text=build/quality/persuasion.txt
    mkdir -p build/quality
    [ -f "$text" ] || .venv/bin/python -c "from farctx.eval.data import austen; open('$text', 'w').write(austen('persuasion'))"
    report "$out/ppl-string-SmolLM2-135M-Instruct.md" $farctx eval ppl -f "$text" --methods vanilla,selfextend,string \
        --lengths 4k,8k,16k --window 256 -t "${THREADS:-2}" -fa on --json "$out/ppl-string-SmolLM2-135M-Instruct.json" \
        --plot "$out/ppl-string-SmolLM2-135M-Instruct.png"
fi

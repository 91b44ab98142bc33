#!/usr/bin/env bash
# A real model reading a prompt past its context with lminf and mesa, then 48 greedy tokens:
# MODEL=gemma3-270m (the default here: Gemma 3 270M, interleaved sliding-window layers, 5 of 6 layers
# slide over 512 tokens, 32k trained context) or MODEL=default (SmolLM2-135M-Instruct, 8k).
# A 32k context takes hours on 2 CPU cores: by default the methods assume a 2,048-token context
# (--n-ctx-train 2048) and the prompt is ~4x that (8,300 tokens of Emma), which exercises the same
# mechanism (full-attention layers past their assumed context, a fixed cache for lminf). N_CTX_TRAIN=0
# and N_TOKENS=34000 run it for real (on a GPU add NGL=all). Outputs: bench/results/past-context/MODEL/ (TAG=x: files
# METHOD-x.txt, beside the default run's).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${MODEL:-gemma3-270m}
out="$root/bench/results/past-context/$model"
n_ctx_train=${N_CTX_TRAIN:-2048}
n_tokens=${N_TOKENS:-8300}
mkdir -p "$out"
tag=${TAG:+-$TAG}
"$root/.venv/bin/python" "$root/bench/austen_prompt.py" "$out/prompt$tag.txt" "$n_tokens" "$model"
for method in ${METHODS:-lminf mesa}; do
    model_arg=()
    [ "$model" = default ] || model_arg=(-m "$model")
    cmd=(farctx generate "${model_arg[@]}" -f "bench/results/past-context/$model/prompt$tag.txt" -n 48 --temp 0 --seed 1 -t "${THREADS:-2}"
         -ngl "${NGL:-0}" --method "$method" --n-ctx-train "$n_ctx_train" --json)
    echo "\$ ${cmd[*]}" > "$out/$method$tag.txt"
    ( cd "$root" && /usr/bin/time -f "%e s wall, %M KiB max RSS" ".venv/bin/python" -m farctx.cli.main "${cmd[@]:1}" ) \
        >> "$out/$method$tag.txt" 2>&1
done

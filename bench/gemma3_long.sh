#!/usr/bin/env bash
# Gemma 3 270M (interleaved sliding-window layers: 5 of 6 layers slide over 512 tokens) reading a
# prompt past its context with lminf and mesa, then 48 greedy tokens. Its trained context is 32k,
# which takes hours on 2 CPU cores: by default the methods assume a 2,048-token context
# (--n-ctx-train 2048) and the prompt is ~4x that (8,300 tokens of Emma), which exercises the same
# mechanism (global layers past their assumed context, fixed cache for lminf). N_CTX_TRAIN=0 and
# N_TOKENS=34000 run it for real (a GPU: add NGL=all). Outputs land in bench/gemma3/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/bench/gemma3"
n_ctx_train=${N_CTX_TRAIN:-2048}
n_tokens=${N_TOKENS:-8300}
mkdir -p "$out"
"$root/.venv/bin/python" - "$out/prompt.txt" "$n_tokens" <<'PY'
import sys
import farctx
from farctx.data import austen
from farctx.models import gemma3_model_path
target = int(sys.argv[2])
words = austen("emma").split(" ")
llm = farctx.Llama(str(gemma3_model_path()), n_ctx=256)
lo, hi = 0, len(words)
while lo < hi:  # the shortest prefix of whole words past the target length in Gemma's tokens
    mid = (lo + hi) // 2
    if len(llm.tokenize(" ".join(words[:mid]).encode())) < target:
        lo = mid + 1
    else:
        hi = mid
open(sys.argv[1], "w").write(" ".join(words[:lo]))
PY
for method in ${METHODS:-lminf mesa}; do
    cmd=(farctx generate -m gemma3-270m -f bench/gemma3/prompt.txt -n 48 --temp 0 --seed 1 -t "${THREADS:-2}"
         -ngl "${NGL:-0}" --method "$method" --n-ctx-train "$n_ctx_train" --json)
    echo "\$ ${cmd[*]}" > "$out/$method.txt"
    ( cd "$root" && /usr/bin/time -f "%e s wall, %M KiB max RSS" ".venv/bin/python" -m farctx.cli.main "${cmd[@]:1}" ) \
        >> "$out/$method.txt" 2>&1
done

#!/usr/bin/env bash
# The out-of-distribution factors on the short-context model (trained context 256) to 16x, every
# method compared; about a minute on 2 CPU cores. Outputs: bench/results/quality/ood-shortctx-256.{md,json,png}
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=bench/results/quality
name=shortctx-256
methods=${METHODS:-vanilla,lminf,window,mesa}
cmd=(eval ood -m models/shortctx-256/shortctx-256-f16.gguf --methods "$methods" --lengths 256,1k,4k
     --json "$out/ood-$name.json" --plot "$out/ood-$name.png")
echo "\$ farctx ${cmd[*]}" > "$out/ood-$name.md"
.venv/bin/farctx "${cmd[@]}" >> "$out/ood-$name.md"

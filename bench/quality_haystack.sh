#!/usr/bin/env bash
# Needle in a haystack on real prose: passkey retrieval with held-out Persuasion as the filler, on the
# short-context model (trained context 256), 1x-4x, three depths. A few minutes on 2 CPU cores.
# Outputs: bench/results/quality/passkey-haystack-shortctx-256.{md,json,png}
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=bench/results/quality
name=shortctx-256
methods=${METHODS:-vanilla,lminf,window,streaming,mesa}
cmd=(eval passkey -m models/shortctx-256/shortctx-256-f16.gguf --methods "$methods" --lengths 256,512,1k
     --depths 0,0.5,1 --samples 4 --seed 1 --haystack austen:persuasion -t 2
     --json "$out/passkey-haystack-$name.json" --plot "$out/passkey-haystack-$name.png")
echo "\$ farctx ${cmd[*]}" > "$out/passkey-haystack-$name.md"
.venv/bin/farctx "${cmd[@]}" >> "$out/passkey-haystack-$name.md"

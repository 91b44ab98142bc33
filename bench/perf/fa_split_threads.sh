#!/usr/bin/env bash
# Patch 0017 by CPU samples per thread (wall-clock ratios on these cores scatter wider than the effect):
# lminf decodes 512 tokens after a 32k prompt on the attention-bound model, -t 2, -fa on, under `perf record`
# (sampling only the decode), once with FARCTX_FA_SPLIT_EVEN=1 (stock's equal ranges) and once with the
# balanced ranges. Per thread: samples in flash attention (the kernel, its F16 dot products, expf), samples
# spinning in libgomp (waiting at a barrier), and all samples (the threads spin, so all ~ wall time).
# Output: bench/perf/fa-split/threads.txt. About 2 minutes; needs `perf`.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
model=build/bench/attnbound-2k.gguf
[ -f "$model" ] || .venv/bin/python bench/attnbound_model.py "$model" >/dev/null
out=bench/perf/fa-split/threads.txt
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/worker.py" <<'PY'
import os, sys
from farctx.bench.worker import corpus, open_farctx
model, method, length, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llm = open_farctx(model, method, length, n + 1, {"n_threads": 2, "flash_attn": True, "verbose": False})
tokens = corpus(lambda b: llm.tokenize(b, add_bos=False), length + n + 1)
llm.eval(tokens[:length])
llm.eval([tokens[length]])
def perf(cmd):
    with open(os.environ["PERF_CTL"], "w") as f:
        f.write(cmd + "\n")
    with open(os.environ["PERF_ACK"]) as f:
        f.readline()
perf("enable")
for t in tokens[length + 1 : length + n + 1]:
    llm.eval([t])
perf("disable")
PY
echo "lminf, 512 tokens decoded after a 32768-token prompt (attention-bound model, -t 2, -fa on); perf samples at 10 kHz" > "$out"
for variant in even balanced; do
    mkfifo "$tmp/ctl-$variant" "$tmp/ack-$variant"
    env $([ $variant = even ] && echo FARCTX_FA_SPLIT_EVEN=1 || echo FARCTX_FA_SPLIT_EVEN=0) \
        PERF_CTL="$tmp/ctl-$variant" PERF_ACK="$tmp/ack-$variant" \
        perf record -q -s -F 10000 -D -1 --control "fifo:$tmp/ctl-$variant,$tmp/ack-$variant" -o "$tmp/$variant.data" \
        .venv/bin/python "$tmp/worker.py" "$model" lminf 32768 512 >/dev/null 2>&1
    perf report -i "$tmp/$variant.data" --sort pid,sym --stdio -n 2>/dev/null | grep -v '^#' | grep -v '^$' |
        .venv/bin/python -c '
import collections, sys
variant = sys.argv[1]
fa, spin, total = collections.Counter(), collections.Counter(), collections.Counter()
for line in sys.stdin:
    parts = line.split()
    if len(parts) < 5:
        continue
    n, tid, sym = int(parts[1]), parts[2], " ".join(parts[4:])
    total[tid] += n
    fa[tid] += any(k in sym for k in ("flash_attn", "vec_dot_f16", "expf")) and n
    spin[tid] += sym.startswith("0x0000") and n
for i, tid in enumerate(sorted(total, key=lambda t: -fa[t])):
    print(f"{variant:8s} thread {i}: flash attention {fa[tid]:5d}  spinning {spin[tid]:5d}  all {total[tid]:5d} samples")
' "$variant" >> "$out"
done
cat "$out"

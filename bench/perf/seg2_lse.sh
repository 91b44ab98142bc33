#!/usr/bin/env bash
# Issue 16, patches 0015/0016: lminf and streaming past n_local on the CPU through two flash-attention calls merged
# by their log-sum-exps, against FARCTX_SEG2_LSE=0 (patch 0012's paths); see bench/perf/seg2_fa.sh.
exec env OUT=bench/perf/seg2-lse METHODS=window,lminf,streaming,vanilla BEFORE=FARCTX_SEG2_LSE=0 \
    AFTER=FARCTX_SEG2_LSE=1 "$(dirname "$0")/seg2_fa.sh"

#!/usr/bin/env bash
# Compile check of the CUDA build on a machine without a GPU (not part of CI's tests).
#   CUDA_CHECK_PIP=1 scripts/cuda-check.sh   the same through pip (CMAKE_ARGS=-DGGML_CUDA=on ...): a wheel with libggml-cuda.so
# Configures and builds the patched llama.cpp with ggml-cuda, plus libfarctx, into
# build/cmake-cuda for one architecture (default 90, Hopper), GGML_NATIVE=OFF.
#
#   scripts/cuda-check.sh                       sm_90, all cores, niced
#   CUDA_ARCHITECTURES="75;80;86;89;90" JOBS=2 scripts/cuda-check.sh
#
# Needs nvcc (CUDA 13; /usr/local/cuda-13.0 here is a minimal toolkit without cuBLAS). When
# the toolkit has no cuBLAS, the nvidia-cublas wheel (13.0.2.14, about 420 MB) is downloaded
# once with pip into build/cuda-deps and unpacked there (scripts/cuda-env.sh points CMake at
# it). ccache caches nvcc too: a repeat with no CUDA change takes about a minute.
# Log: build/cuda-check.log. Prints the elapsed time and the built libraries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PY=${PYTHON:-}
[ -z "$PY" ] && [ -x "$root/.venv/bin/python" ] && PY=$root/.venv/bin/python
PY=${PY:-python3}
export PYTHON=$PY
[ -d "$root/.venv/bin" ] && export PATH="$root/.venv/bin:$PATH"   # cmake, ninja
CUBLAS_WHEEL_VERSION=${CUBLAS_WHEEL_VERSION:-13.0.2.14}
arch=${CUDA_ARCHITECTURES:-90}
out=$root/build/cmake-cuda
log=$root/build/cuda-check.log
mkdir -p "$root/build"
: > "$log"
say() { echo "farctx cuda-check: $*" | tee -a "$log" >&2; }

. "$root/scripts/cuda-env.sh"
if ! farctx_find_cublas 2>>"$log"; then
    deps=$root/build/cuda-deps
    mkdir -p "$deps"
    if ! ls "$deps"/nvidia_cublas-"$CUBLAS_WHEEL_VERSION"-*.whl >/dev/null 2>&1; then
        say "downloading the nvidia-cublas $CUBLAS_WHEEL_VERSION wheel (cuBLAS headers and libraries)"
        "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
            "nvidia-cublas==$CUBLAS_WHEEL_VERSION" -d "$deps" >>"$log" 2>&1
    fi
    say "unpacking the nvidia-cublas wheel into build/cuda-deps"
    (cd "$deps" && "$PY" -m zipfile -e nvidia_cublas-"$CUBLAS_WHEEL_VERSION"-*.whl .) >>"$log" 2>&1
    farctx_find_cublas
fi
say "nvcc $FARCTX_NVCC ($("$FARCTX_NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')), cuBLAS ${FARCTX_CUBLAS_DIR:-in the toolkit}"
say "CUDA architectures: $arch, jobs: ${JOBS:-$(nproc)}"

if [ "${CUDA_CHECK_PIP:-0}" = 1 ]; then
    # the user's way in: pip with CMAKE_ARGS, the wheel into build/dist-cuda (CMake tree in
    # build/cmake-cuda-pip); passes when the wheel carries farctx/lib/libggml-cuda.so
    start=$(date +%s)
    say "pip wheel with CMAKE_ARGS=-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch"
    rm -rf "$root/build/dist-cuda"
    status=0
    PATH="$root/.venv/bin:$PATH" CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch $FARCTX_CUDA_CMAKE ${CMAKE_ARGS:-}" \
        nice -n 19 "$PY" -m pip wheel -v --disable-pip-version-check --no-deps --no-build-isolation \
        --config-settings=build-dir=build/cmake-cuda-pip -w "$root/build/dist-cuda" "$root" >>"$log" 2>&1 || status=$?
    elapsed=$(( $(date +%s) - start ))
    wheel=$(ls "$root"/build/dist-cuda/farctx-*.whl 2>/dev/null || true)
    if [ "$status" != 0 ] || [ -z "$wheel" ] || ! "$PY" -m zipfile -l "$wheel" | grep -q "farctx/lib/libggml-cuda.so"; then
        tail -n 40 "$log" >&2
        say "pip CUDA wheel FAILED after ${elapsed}s (exit $status); log: build/cuda-check.log"
        exit 1
    fi
    say "pip CUDA wheel passed in ${elapsed}s: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB, libggml-cuda.so inside)"
    exit 0
fi
start=$(date +%s)
# an existing build folder keeps its cache: re-apply the arguments that this check decides
if [ -f "$out/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$out" -DFARCTX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
        $FARCTX_CUDA_CMAKE >"$out.configure.log" 2>&1 || { cat "$out.configure.log" >&2; exit 1; }
fi
status=0
FARCTX_CUDA=1 CUDA_ARCHITECTURES="$arch" CMAKE_ARGS="$FARCTX_CUDA_CMAKE ${CMAKE_ARGS:-}" \
    nice -n 19 "$root/scripts/build.sh" >>"$log" 2>&1 || status=$?
elapsed=$(( $(date +%s) - start ))
if [ "$status" != 0 ] || [ ! -f "$out/bin/libggml-cuda.so" ]; then
    tail -n 40 "$log" >&2
    say "FAILED after ${elapsed}s (exit $status); log: build/cuda-check.log"
    exit 1
fi
say "built in $((elapsed / 60)) min $((elapsed % 60)) s"
(cd "$out/bin" && ls -l --block-size=K ./*.so) | tee -a "$log" >&2
grep -q "sm_${arch%%;*}" < <(cuobjdump --list-elf "$out/bin/libggml-cuda.so" 2>/dev/null || true) \
    && say "libggml-cuda.so holds sm_${arch%%;*} machine code"
say "ok"

# Sourced by scripts/cuda-check.sh and scripts/gpu-check (not run on its own).
# Finds cuBLAS for a CUDA build of llama.cpp and sets
#   FARCTX_CUBLAS_DIR     a folder with include/cublas_v2.h and lib/libcublas.so.13 (or lib64/)
#   FARCTX_CUDA_CMAKE     CMake arguments that point ggml-cuda at it
#   FARCTX_CUDA_LIBPATH   folders to put on LD_LIBRARY_PATH when loading libggml-cuda
# Where it looks, in order: $FARCTX_CUBLAS_DIR; the CUDA toolkit next to nvcc; an installed
# nvidia-cublas Python wheel (nvidia/cu13 in a site-packages of $PYTHON or python3);
# $root/build/cuda-deps/nvidia/cu13 (an unpacked wheel, made by scripts/cuda-check.sh).
# A toolkit with cuBLAS needs no extra arguments. Without one, FindCUDAToolkit is given the
# libraries by hand (CUDA_cublas_LIBRARY, CUDA_cublasLt_LIBRARY) and the headers through the
# compile flags, and GGML_CUDA_NO_VMM=ON keeps ggml-cuda from linking the driver library
# (libcuda.so, absent on a machine without a GPU; the legacy memory pool replaces the VMM one).

farctx_find_cublas() {
    local nvcc tk cand py
    FARCTX_CUDA_CMAKE=""
    FARCTX_CUDA_LIBPATH=""
    nvcc=$(command -v nvcc || true)
    [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
    if [ -z "$nvcc" ]; then
        echo "farctx: no nvcc on PATH (nor /usr/local/cuda/bin/nvcc)" >&2
        return 1
    fi
    # the toolkit's own nvcc (a wrapper script in /usr/local/bin is common): ask it
    FARCTX_NVCC=$("$nvcc" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -n1)
    FARCTX_NVCC=${FARCTX_NVCC:+$FARCTX_NVCC/nvcc}
    [ -x "${FARCTX_NVCC:-}" ] || FARCTX_NVCC=$(readlink -f "$nvcc")
    tk=$(cd "$(dirname "$FARCTX_NVCC")/.." && pwd)
    FARCTX_CUDA_LIBPATH="$tk/lib64:$tk/lib"
    # 1. given
    if [ -n "${FARCTX_CUBLAS_DIR:-}" ]; then
        :
    # 2. the toolkit has it: nothing to add
    elif [ -f "$tk/include/cublas_v2.h" ] && ls "$tk"/lib64/libcublas.so* "$tk"/lib/libcublas.so* >/dev/null 2>&1; then
        FARCTX_CUBLAS_DIR=""
        FARCTX_CUDA_CMAKE="-DCMAKE_CUDA_COMPILER=$FARCTX_NVCC -DGGML_CUDA_NO_VMM=ON"
        return 0
    else
        # 3. a pip-installed nvidia-cublas
        for py in "${PYTHON:-}" python3; do
            [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
            cand=$("$py" - <<'PY' 2>/dev/null || true
import os, sys
for p in sys.path:
    d = os.path.join(p, "nvidia", "cu13")
    if os.path.isfile(os.path.join(d, "include", "cublas_v2.h")) and \
       os.path.isfile(os.path.join(d, "lib", "libcublas.so.13")):
        print(d); break
PY
)
            if [ -n "$cand" ]; then FARCTX_CUBLAS_DIR=$cand; break; fi
        done
        # 4. the wheel unpacked by scripts/cuda-check.sh
        if [ -z "${FARCTX_CUBLAS_DIR:-}" ] && [ -f "$root/build/cuda-deps/nvidia/cu13/include/cublas_v2.h" ]; then
            FARCTX_CUBLAS_DIR="$root/build/cuda-deps/nvidia/cu13"
        fi
    fi
    if [ -z "${FARCTX_CUBLAS_DIR:-}" ]; then
        echo "farctx: no cuBLAS found (toolkit $tk has none; no nvidia-cublas wheel in reach)" >&2
        return 1
    fi
    local lib=$FARCTX_CUBLAS_DIR/lib
    [ -d "$lib" ] || lib=$FARCTX_CUBLAS_DIR/lib64
    local b so
    for b in cublas cublasLt; do
        so=$lib/lib$b.so
        if [ ! -e "$so" ]; then
            # a wheel ships only the .so.13; the linker wants the unversioned name. Link it
            # into a writable folder of our own when the wheel's folder is not ours to change.
            if [ -w "$lib" ]; then
                ln -sf "lib$b.so.13" "$so"
            else
                mkdir -p "$root/build/cuda-deps/links"
                ln -sf "$lib/lib$b.so.13" "$root/build/cuda-deps/links/lib$b.so"
                so=$root/build/cuda-deps/links/lib$b.so
            fi
        fi
        [ "$b" = cublas ] && FARCTX_CUDA_CMAKE+=" -DCUDA_cublas_LIBRARY=$so"
        [ "$b" = cublasLt ] && FARCTX_CUDA_CMAKE+=" -DCUDA_cublasLt_LIBRARY=$so"
    done
    FARCTX_CUDA_CMAKE+=" -DCMAKE_CUDA_COMPILER=$FARCTX_NVCC -DGGML_CUDA_NO_VMM=ON"
    FARCTX_CUDA_CMAKE+=" -DCMAKE_CUDA_FLAGS=-I$FARCTX_CUBLAS_DIR/include -DCMAKE_CXX_FLAGS=-I$FARCTX_CUBLAS_DIR/include"
    FARCTX_CUDA_LIBPATH="$lib:$FARCTX_CUDA_LIBPATH"
    export FARCTX_CUBLAS_DIR
    return 0
}

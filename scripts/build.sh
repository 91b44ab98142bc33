#!/usr/bin/env bash
# Build the patched llama.cpp and libfarctx into build/cmake/bin (CPU by default) and, when the
# .venv has farctx installed (scripts/setup.sh), install them into its package (farctx/lib).
#   FARCTX_CUDA=1 scripts/build.sh            CUDA build into build/cmake-cuda
#   CUDA_ARCHITECTURES="90" ...               architectures for the CUDA build
#   FARCTX_VULKAN=1 scripts/build.sh          Vulkan build into build/cmake-vulkan
#   FARCTX_STOCK=1 scripts/build.sh           stock llama.cpp (no patches) into build/cmake-stock
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stock=(); [ "${FARCTX_STOCK:-0}" = 1 ] && stock=(--stock)
"${PYTHON:-python3}" "$root/scripts/fetch_llama.py" "${stock[@]}"
export CCACHE_BASEDIR="$root"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_NOHASHDIR=1
jobs=${JOBS:-$(nproc)}
args=(-DCMAKE_BUILD_TYPE=Release)
if [ "${FARCTX_STOCK:-0}" = 1 ]; then
    out="$root/build/cmake-stock"
    args+=(-DFARCTX_LLAMA_DIR="$root/build/llama.cpp-stock" -DFARCTX_BUILD_NATIVE=OFF)
elif [ "${FARCTX_CUDA:-0}" = 1 ]; then
    out="$root/build/cmake-cuda"
    args+=(-DFARCTX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-75;80;86;89;90}")
elif [ "${FARCTX_VULKAN:-0}" = 1 ]; then
    out="$root/build/cmake-vulkan"
    args+=(-DFARCTX_VULKAN=ON -DVulkan_INCLUDE_DIR="$("$root/scripts/vulkan-headers.sh")")
else
    out="$root/build/cmake"
fi
if [ "${FARCTX_NATIVE_CPU:-0}" = 1 ]; then args+=(-DFARCTX_NATIVE_CPU=ON); fi
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
if [ ! -f "$out/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$out" "${gen[@]}" "${args[@]}" ${CMAKE_ARGS:-} >"$out.configure.log" 2>&1 \
        || { cat "$out.configure.log" >&2; exit 1; }
fi
# progress lines dropped; compiler messages and the build's exit status kept
cmake --build "$out" -j "$jobs" 2>&1 | { grep -v '^\[[0-9/]*\] ' || true; }
test -f "$out/bin/libllama.so" -o -f "$out/bin/libllama.dylib"
echo "farctx: libraries in $out/bin" >&2
venv_py="$root/.venv/bin/python"
if [ "$out" = "$root/build/cmake" ] && [ -x "$venv_py" ] \
        && site=$("$venv_py" -c "import farctx, sysconfig; print(sysconfig.get_paths()['platlib'])" 2>/dev/null); then
    cmake --install "$out" --component farctx --prefix "$site" >/dev/null
    echo "farctx: installed into $site/farctx/lib" >&2
fi

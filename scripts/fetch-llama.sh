#!/usr/bin/env bash
# Fetch the pinned llama.cpp (vendored in the llama-cpp-python sdist), verify it, and lay out
#   build/dl/<sdist>            the downloaded sdist (sha256-checked)
#   build/llama.cpp-stock/      pristine vendor/llama.cpp (for stock baselines)
#   build/llama.cpp/            the same with patches/*.patch applied in order
# A patch that does not apply stops the script and names the patch.
# If build/llama.cpp/.git exists it is a developer's working tree: it is left alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/llama-pin.env"
PY=${PYTHON:-python3}
dl="$root/build/dl"
mkdir -p "$dl"
sdist="$dl/$LLAMA_CPP_PYTHON_SDIST"

check_sha() { echo "$LLAMA_CPP_PYTHON_SHA256  $1" | sha256sum -c --status; }

if [ ! -f "$sdist" ] || ! check_sha "$sdist"; then
    echo "farctx: fetching llama-cpp-python $LLAMA_CPP_PYTHON_VERSION source distribution" >&2
    rm -f "$sdist"
    "$PY" -m pip download --quiet --no-deps --no-binary=llama-cpp-python \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$dl"
    if ! check_sha "$sdist"; then
        echo "farctx: sha256 mismatch for $sdist (expected $LLAMA_CPP_PYTHON_SHA256)" >&2
        exit 1
    fi
fi

stock="$root/build/llama.cpp-stock"
if [ ! -f "$stock/.farctx-extracted" ]; then
    echo "farctx: extracting vendor/llama.cpp" >&2
    rm -rf "$stock" "$root/build/extract"
    mkdir -p "$root/build/extract"
    tar -xzf "$sdist" -C "$root/build/extract" "${LLAMA_CPP_PYTHON_SDIST%.tar.gz}/vendor/llama.cpp"
    mv "$root/build/extract/${LLAMA_CPP_PYTHON_SDIST%.tar.gz}/vendor/llama.cpp" "$stock"
    rm -rf "$root/build/extract"
    rm -rf "$stock/.git"  # a submodule pointer into the sdist author's checkout
    touch "$stock/.farctx-extracted"
fi

patched="$root/build/llama.cpp"
if [ -d "$patched/.git" ]; then
    echo "farctx: build/llama.cpp is a git working tree (developer mode): patches not re-applied" >&2
    exit 0
fi
stamp=$( (cat "$root"/patches/*.patch 2>/dev/null || true) | sha256sum | cut -c1-16)
if [ -f "$patched/.farctx-patches" ] && [ "$(cat "$patched/.farctx-patches")" = "$stamp" ]; then
    exit 0
fi
echo "farctx: applying patches to a fresh copy of llama.cpp" >&2
rm -rf "$patched.tmp"
cp -a "$stock" "$patched.tmp"
for p in "$root"/patches/*.patch; do
    [ -e "$p" ] || continue
    # the ceiling keeps git from treating the tree as part of an enclosing repository (where
    # `git apply` would silently skip every path outside the current folder)
    if ! (cd "$patched.tmp" && GIT_CEILING_DIRECTORIES="$root/build" git apply --verbose --whitespace=nowarn "$p" 2>"$root/build/apply.log") \
            || grep -q "^Skipped" "$root/build/apply.log"; then
        cat "$root/build/apply.log" >&2
        echo "farctx: patch does not apply: patches/$(basename "$p")" >&2
        rm -rf "$patched.tmp"
        exit 1
    fi
    echo "  applied $(basename "$p")" >&2
done
echo "$stamp" > "$patched.tmp/.farctx-patches"
rm -rf "$patched"
mv "$patched.tmp" "$patched"

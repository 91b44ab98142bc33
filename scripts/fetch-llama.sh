#!/usr/bin/env bash
# Fetch the pinned llama.cpp (vendored in the llama-cpp-python sdist), verify it, and lay out
# build/dl, build/llama.cpp-stock and build/llama.cpp (patched): scripts/fetch_llama.py says how.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exec "${PYTHON:-python3}" "$root/scripts/fetch_llama.py" --stock "$@"

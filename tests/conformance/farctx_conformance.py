"""A pytest plugin that runs llama-cpp-python's own tests against farctx.Llama (tests/test_conformance.py).

FARCTX_CONFORMANCE_METHOD names the method every `llama_cpp.Llama(...)` of those tests runs: a farctx method,
"default" (farctx.Llama given no method), or "stock" (llama_cpp.Llama itself on the same patched library). The downloads are answered by stand_in.py; scipy
(imported by test_llama.py, never called) is replaced by a module with its one function when it is absent.

FARCTX_CONFORMANCE_BREAK=load_state makes farctx.Llama.load_state skip the stream, as before farctx restored it:
tests/test_conformance.py checks that the run then fails.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import numpy as np
import pytest
from stand_in import MODEL_SPECIFIC, NO_STAND_IN, STAND_INS

import farctx  # first: points llama_cpp at the patched library
import llama_cpp

METHOD = os.environ.get("FARCTX_CONFORMANCE_METHOD", "vanilla")
BREAK = os.environ.get("FARCTX_CONFORMANCE_BREAK", "")


def _hf_hub_download(repo_id: str, filename: str, *args: Any, **kwargs: Any) -> str:
    if filename in NO_STAND_IN:
        pytest.skip(NO_STAND_IN[filename])
    if filename not in STAND_INS:
        raise AssertionError(f"llama-cpp-python's tests download {repo_id}/{filename}: give it a stand-in in "
                             "tests/conformance/stand_in.py")
    return str(farctx.default_model_path())


def _log_softmax(x: Any, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _install_stand_in_modules() -> None:
    hub = sys.modules.get("huggingface_hub") or types.ModuleType("huggingface_hub")
    hub.hf_hub_download = _hf_hub_download  # type: ignore[attr-defined]
    sys.modules["huggingface_hub"] = hub
    try:
        import scipy.special  # noqa: F401
    except ImportError:
        scipy, special = types.ModuleType("scipy"), types.ModuleType("scipy.special")
        special.log_softmax = _log_softmax  # type: ignore[attr-defined]
        scipy.special = special  # type: ignore[attr-defined]
        sys.modules["scipy"], sys.modules["scipy.special"] = scipy, special


class _MethodLlama(farctx.Llama):
    """farctx.Llama with the method of this run, for code that constructs `llama_cpp.Llama(...)`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if METHOD != "default":
            kwargs.setdefault("method", METHOD)
        super().__init__(*args, **kwargs)

    if BREAK == "load_state":
        def load_state(self, state: Any) -> None:
            llama_cpp.llama.Llama.load_state(self, state)


_install_stand_in_modules()
if METHOD != "stock":
    llama_cpp.Llama = _MethodLlama  # type: ignore[misc]


def pytest_report_header(config: pytest.Config) -> str:
    who = "stock" if METHOD == "stock" else f"farctx.Llama(method={METHOD!r})"
    return f"farctx conformance: llama_cpp.Llama is {who}" + (f", broken: {BREAK}" if BREAK else "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = MODEL_SPECIFIC.get(f"{item.path.name}::{getattr(item, 'originalname', item.name)}")
        if reason:
            item.add_marker(pytest.mark.xfail(reason=f"model-specific: {reason}", strict=True))

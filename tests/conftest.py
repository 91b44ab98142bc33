"""Fixtures that own the real components: the built library, a GGUF made at test time, the bundled model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import farctx  # noqa: F401  (first: points llama_cpp at the patched library)

sys.path.insert(0, str(Path(__file__).parent))

from helpers import gpu_layers  # noqa: E402
from oracle import OracleModel  # noqa: E402
from tiny_gguf import DEEP, TinyConfig, write_tiny_gguf  # noqa: E402

if gpu_layers():  # FARCTX_TEST_NGL=all: every engine of the tests offloads its layers to the GPU
    _llama_init = farctx.Llama.__init__

    def _llama_init_offloaded(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("n_gpu_layers", gpu_layers())
        _llama_init(self, *args, **kwargs)

    farctx.Llama.__init__ = _llama_init_offloaded  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def default_model() -> Path:
    import farctx

    return farctx.default_model_path()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> Path:
    """A random-weight llama (2 layers, GQA 2:1, head_dim 64, n_ctx_train 32), F32, real tokenizer."""
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", default_model, TinyConfig())


@pytest.fixture(scope="session")
def oracle(tiny_model: Path) -> OracleModel:
    return OracleModel(tiny_model)


@pytest.fixture(scope="session")
def deep_model(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> Path:
    """A random-weight llama with the default model's depth and head layout (30 layers, GQA 3:1, head_dim 64),
    narrow (n_embd 192), n_ctx_train 32: graphs of the real model's size, computed in milliseconds."""
    return write_tiny_gguf(tmp_path_factory.mktemp("deep") / "deep30.gguf", default_model, DEEP)

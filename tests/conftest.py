"""Fixtures that own the real components: the built library, a GGUF made at test time, the bundled model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import farctx  # noqa: F401  (first: points llama_cpp at the patched library)

sys.path.insert(0, str(Path(__file__).parent))

from oracle import OracleModel  # noqa: E402
from tiny_gguf import TinyConfig, write_tiny_gguf  # noqa: E402


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

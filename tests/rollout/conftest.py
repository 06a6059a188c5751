"""A tiny random-init causal LM with a 512-token vocabulary, built from a config (no download)."""

from __future__ import annotations

from typing import Any

import pytest


def build_tiny_model(seed: int = 0) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=512,
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

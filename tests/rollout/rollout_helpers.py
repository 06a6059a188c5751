"""Helpers of the rollout tests (a module of its own: test modules cannot import a conftest by name when
several test directories each have one)."""

from __future__ import annotations

from typing import Any


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

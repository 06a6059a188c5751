"""Shared fixtures of the trainer tests: one tiny random-init Qwen2-shaped model saved once per session,
and a TrainingRun spec pointing at it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures.ray_start import init_ray
from fixtures.tiny_model import build_tiny_model

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

VOCAB = 64


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_tiny_model(
        VOCAB, hidden_size=32, intermediate_size=64, max_position_embeddings=512, tie_word_embeddings=False
    )
    directory = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def run_document(tiny_model_dir: Path) -> Callable[..., dict[str, Any]]:
    """A TrainingRun document for the tiny model; keyword arguments override spec sections."""

    def make(**spec: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "model": {"base": str(tiny_model_dir)},
            "dataset": {"uri": "/nonexistent"},
            "sandboxPoolRef": {"name": "pool"},
            "algorithm": {
                "steps": 3,
                "batchSize": 4,
                "klCoef": 0.05,
                "actorLearningRate": 1e-3,
                "criticLearningRate": 1e-3,
            },
            "checkpoint": {"everySteps": 1},
            "trainer": {
                "engine": "torch",
                "precision": "fp32",
                "microBatchTokens": 96,
                "logitsChunkTokens": 16,
                "useRay": False,
                # One optimizer step per PPO step: test_ppo_step's plain reference writes one step. The
                # learning tests ask for the default (4) themselves.
                "miniBatches": 1,
            },
        }
        for key, value in spec.items():
            base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
        return {
            "apiVersion": "cuda-agent.io/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "tiny"},
            "spec": base,
        }

    return make


@pytest.fixture(scope="session")
def ray_cluster() -> Any:
    """One local Ray cluster for every trainer test that needs it (127.0.0.1 only, no dashboard)."""
    import ray

    started = not ray.is_initialized()
    if started:
        init_ray(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {"DS_ACCELERATOR": "cpu"}},
        )
    yield ray
    if started:  # leave a cluster another fixture started alone
        ray.shutdown()

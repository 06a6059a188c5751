"""Checkpoints for exact resume: each role's full training state, the trainer's position and RNG states.

Layout under the checkpoint prefix (a local path, pvc:// or s3://):
    ckpt-000007/actor/...  critic/...  state.json  rng.pt
    latest                  the name of the newest complete checkpoint, written after all its files
    episodes/<stage>/step-000003.jsonl   the trajectories a step learned from, keyed by step, so a step
                                         redone after a crash overwrites its own record
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.storage import ObjectNotFoundError, ObjectStore, join_uri, open_store

LATEST = "latest"


class TrainerState(BaseModel):
    """Where the trainer is: everything but weights, optimizer and RNG."""

    model_config = ConfigDict(extra="forbid")

    stage: str = ""
    stage_step: int = 0  # steps completed in `stage`
    completed_stages: list[str] = Field(default_factory=list)
    ppo_step: int = 0  # multi-turn PPO steps completed (the TrainingRun's status.step)
    data_position: dict[str, int] = Field(default_factory=dict)  # per stage: episodes drawn so far
    episodes: int = 0  # episodes collected by PPO steps (single-turn and multi-turn), each counted once
    warmup_episodes: int = 0  # size of the recorded warm-up source set (RFT / value pretraining)
    checkpoints: int = 0  # checkpoints written so far (names the next one)
    history: list[dict[str, Any]] = Field(default_factory=list)  # per step: stage, step, reward, pass rate


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointStore:
    """Writes and finds checkpoints under one prefix; keeps the newest `keep`."""

    def __init__(self, prefix: str, keep: int, store: ObjectStore | None = None) -> None:
        self.prefix = prefix.rstrip("/")
        self.keep = keep
        self.store = store or open_store(prefix)

    def uri(self, name: str) -> str:
        return join_uri(self.prefix, name)

    def save(self, state: TrainerState, save_roles: Callable[[Path, str], None]) -> str:
        """Write checkpoint number state.checkpoints. save_roles(root, uri) writes the roles' directories
        under the local `root` (uploaded with the rest) or, from other machines, straight to `uri`."""
        name = f"ckpt-{state.checkpoints:06d}"
        state = state.model_copy(update={"checkpoints": state.checkpoints + 1})
        with tempfile.TemporaryDirectory(prefix="cuda-agent-ckpt-") as tmp:
            root = Path(tmp)
            save_roles(root, self.uri(name))
            torch.save(rng_state(), root / "rng.pt")
            (root / "state.json").write_text(state.model_dump_json(indent=1))
            self.store.upload_dir(root, self.uri(name))
        self.store.put_bytes(self.uri(LATEST), name.encode())
        self._prune(name)
        return self.uri(name)

    def latest(self) -> str | None:
        try:
            name = self.store.get_bytes(self.uri(LATEST)).decode().strip()
        except ObjectNotFoundError:
            return None
        return self.uri(name) if name else None

    def _prune(self, newest: str) -> None:
        names = sorted(
            {
                info.uri[len(self.prefix) + 1 :].split("/")[0]
                for info in self.store.list_objects(self.prefix + "/ckpt-")
            }
        )
        for old in [n for n in names if n < newest][: max(0, len(names) - self.keep)]:
            for info in list(self.store.list_objects(self.uri(old) + "/")):
                self.store.delete(info.uri)


def peek_state(uri: str) -> TrainerState:
    """Only the trainer state of the checkpoint at `uri` (status reports before any role is built)."""
    return TrainerState.model_validate_json(open_store(uri).get_bytes(join_uri(uri, "state.json")))


def load_checkpoint(uri: str, load_roles: Callable[[Path, str], None]) -> TrainerState:
    """Restore roles and RNG from the checkpoint at `uri`; returns the trainer state stored with it."""
    store = open_store(uri)
    tmp = Path(tempfile.mkdtemp(prefix="cuda-agent-resume-"))
    try:
        if store.download_dir(uri.rstrip("/") + "/", tmp) == 0:
            raise FileNotFoundError(f"{uri}: empty or missing checkpoint")
        state = TrainerState.model_validate_json((tmp / "state.json").read_text())
        load_roles(tmp, uri)
        restore_rng(torch.load(tmp / "rng.pt", weights_only=False))
        return state
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

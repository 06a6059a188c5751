"""All roles in the trainer process (CPU demos, tests, one-GPU benchmarks); `ray/` is the distributed twin."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.trainer.roles import PolicyActor, Reference, ValueCritic
from cuda_agent.trainer.weight_sync import WeightReceiver, sync_weights


@dataclass
class LocalWorkers:
    actor: PolicyActor
    critic: ValueCritic
    reference: Reference | None
    bucket_bytes: int
    train_gpus: int = 1

    @classmethod
    def build(cls, spec: TrainingRunSpec) -> LocalWorkers:
        reference = Reference(spec) if spec.algorithm.kl_coef > 0 else None
        return cls(PolicyActor(spec), ValueCritic(spec), reference, spec.trainer.weight_sync_bucket_mb << 20)

    def save(self, root: Path, uri: str) -> None:
        self.actor.save(root / "actor")
        self.critic.save(root / "critic")
        if self.reference is not None:
            self.reference.save(root / "reference")

    def load(self, root: Path, uri: str) -> None:
        self.actor.load(root / "actor")
        self.critic.load(root / "critic")
        if self.reference is not None:
            self.reference.load(root / "reference")

    def sync_weights(self, receiver: WeightReceiver) -> dict[str, float]:
        return sync_weights(self.actor.weight_buckets(self.bucket_bytes), receiver)

    def reset_reference(self) -> None:
        if self.reference is not None:
            self.sync_weights(self.reference)

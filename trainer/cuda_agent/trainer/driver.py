"""The trainer's main loop: warm-up stages, then multi-turn PPO, with checkpoints, exact resume,
suspend and status reports.

Stages run in the paper's order: single-turn PPO at a short context, rejection fine-tuning (RFT) on
filtered trajectories, critic value pretraining, multi-turn PPO. Each is skipped when disabled, skipped
when a checkpoint says it is complete, and resumed at its next step otherwise. A step's episode ids and
tasks are functions of (stage, step), so a step redone after a crash learns from the same tasks, records
its episodes under the same key, and counts them once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import trace

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.api.run_contract import TrainerProgress
from cuda_agent.api.trainingrun import TrainingMetrics, TrainingRun, TrainingRunPhase
from cuda_agent.runstatus import StatusWriter
from cuda_agent.storage import join_uri, open_store
from cuda_agent.telemetry import Stage, link_to, record_step, span
from cuda_agent.telemetry.logs import log_fields
from cuda_agent.telemetry.tracing import span_attributes
from cuda_agent.trainer.checkpoint import CheckpointStore, TrainerState, load_checkpoint
from cuda_agent.trainer.data import TaskOrder
from cuda_agent.trainer.event_loop import run_async
from cuda_agent.trainer.experience import episode_from_trajectory
from cuda_agent.trainer.report import stage_fit, write_report
from cuda_agent.trainer.rollout import Rollout, RolloutRequest, learnable, rft_filter
from cuda_agent.trainer.step import (
    ActorRole,
    CriticRole,
    NllRole,
    ReferenceRole,
    policy_nll,
    ppo_step,
    rft_epoch,
    value_pretraining_epoch,
    value_targets,
)
from cuda_agent.trainer.weight_sync import WeightReceiver

log = logging.getLogger(__name__)

SINGLE_TURN_PPO, RFT, VALUE_PRETRAINING, PPO = "single_turn_ppo", "rft", "value_pretraining", "ppo"
STAGES = (SINGLE_TURN_PPO, RFT, VALUE_PRETRAINING, PPO)


class PolicyWorkers(ActorRole, NllRole, Protocol):
    pass


class Workers(Protocol):
    """The roles, in this process or on a Ray cluster."""

    @property
    def actor(self) -> PolicyWorkers: ...
    @property
    def critic(self) -> CriticRole: ...
    @property
    def reference(self) -> ReferenceRole | None: ...
    @property
    def train_gpus(self) -> int: ...

    def save(self, root: Path, uri: str) -> None:
        """Write the roles' state under `root` (this machine) or `uri` (the checkpoint, any machine)."""

    def load(self, root: Path, uri: str) -> None: ...
    def sync_weights(self, receiver: WeightReceiver) -> dict[str, float]: ...

    def reset_reference(self) -> None:
        """The KL reference becomes the actor as it is now (after RFT); no-op without a reference."""


class Stopped(Exception):
    """The run was suspended: a checkpoint is written and the process should exit cleanly."""


@dataclass
class Trainer:
    run: TrainingRun
    rollout: Rollout
    workers: Workers
    status: StatusWriter
    checkpoints: CheckpointStore
    order: TaskOrder
    suspend_requested: Callable[[], bool] = lambda: False
    resume_from: str | None = None
    rft_source: list[Trajectory] | None = None
    # Where the end-of-run report (curves.png, summary.json) also lands on this machine; it always goes
    # next to the checkpoints. `cuda-agent train` passes its working directory (the run directory).
    report_dir: Path | None = None

    def __post_init__(self) -> None:
        self.spec = self.run.spec
        self.state = TrainerState()
        self.last_checkpoint: str | None = None

    # -- the whole run ---------------------------------------------------------------------------
    def train(self) -> TrainerState:
        """Run every remaining stage; returns the final state. Raises Stopped when suspended."""
        self._resume()
        for stage in STAGES:
            if not self._enabled(stage) or stage in self.state.completed_stages:
                continue
            if self.state.stage != stage:
                self.state.stage, self.state.stage_step = stage, 0
            {
                SINGLE_TURN_PPO: self._ppo_stage,
                PPO: self._ppo_stage,
                RFT: self._rft_stage,
                VALUE_PRETRAINING: self._value_stage,
            }[stage]()
            self.state.completed_stages.append(stage)
            self._checkpoint()
        report = write_report(self.state.history, self.checkpoints.prefix, self.report_dir)
        verdict = report["ppo_reward_trend"]["verdict"]
        log.info("run report under %s/report: PPO reward %s", self.checkpoints.prefix, verdict)
        self._report(
            TrainingRunPhase.SUCCEEDED, f"finished {self.state.ppo_step} PPO steps; PPO reward {verdict}"
        )
        return self.state

    def _enabled(self, stage: str) -> bool:
        w = self.spec.warmup
        return {
            SINGLE_TURN_PPO: w.single_turn_ppo.enabled,
            RFT: w.rft.enabled,
            VALUE_PRETRAINING: w.value_pretraining.enabled,
            PPO: True,
        }[stage]

    def _resume(self) -> None:
        uri = self.resume_from or self.checkpoints.latest()
        if uri is None:
            return
        self.state = load_checkpoint(uri, self.workers.load)
        self.last_checkpoint = uri
        # The rollout engines start from the base weights: bring them to the checkpoint's policy.
        self.workers.sync_weights(self.rollout)
        log.info("resumed from %s at %s step %d", uri, self.state.stage, self.state.stage_step)

    # -- stages ----------------------------------------------------------------------------------
    def _ppo_stage(self) -> None:
        stage = self.state.stage
        single = stage == SINGLE_TURN_PPO
        total = self.spec.warmup.single_turn_ppo.steps if single else self.spec.algorithm.steps
        context = (
            self.spec.warmup.single_turn_ppo.max_context_tokens
            if single
            else self.spec.agent.max_context_tokens
        )
        while self.state.stage_step < total:
            with span(Stage.STEP, stage=self.state.stage, step=self.state.stage_step + 1):
                step = self.state.stage_step
                self._report(self._phase(), f"{stage} step {step + 1}/{total}: rollout")
                clock = time.perf_counter()
                trajectories = self._collect(1 if single else self.spec.agent.max_turns_train, context)
                rollout_s = time.perf_counter() - clock
                usable = [t for t in trajectories if learnable(t)]
                if not usable:
                    reasons = sorted({f"{t.end}: {t.error}" if t.error else t.end for t in trajectories})
                    log.warning(
                        "%s step %d: no episode to learn from (%s)", stage, step + 1, "; ".join(reasons)
                    )
                metrics = (
                    ppo_step(
                        usable,
                        self.workers.actor,
                        self.workers.critic,
                        self.workers.reference,
                        self.spec,
                        step_seed=self._seed(step),
                        train_gpus=self.workers.train_gpus,
                    )
                    if usable
                    else {}
                )
                metrics.update(self._sync_weights())
                metrics["rollout_s"] = rollout_s
                metrics["episodes_dropped"] = float(len(trajectories) - len(usable))
                self._finish_step(trajectories, metrics, ppo=not single)

    def _rft_stage(self) -> None:
        rft = self.spec.warmup.rft
        source = self._rft_source()
        kept = rft_filter(source, rft.min_reward, rft.max_repeated_turns)
        log.info("RFT keeps %d of %d trajectories", len(kept), len(source))
        if not kept:
            self._report(self._phase(), f"rft: none of {len(source)} trajectories passed the filter; skipped")
            return
        while self.state.stage_step < rft.epochs:
            epoch = self.state.stage_step + 1
            with span(Stage.STEP, stage=self.state.stage, step=epoch):
                self._report(self._phase(), f"rft epoch {epoch}/{rft.epochs} on {len(kept)} episodes")
                before = self._kept_nll(kept) if epoch == 1 else None
                metrics = rft_epoch(kept, self.workers.actor, self.spec, self._seed(self.state.stage_step))
                if before is not None:
                    metrics["nll_before"] = before
                if epoch == rft.epochs:
                    metrics["nll_after"] = self._kept_nll(kept)
                metrics.update(self._sync_weights())
                metrics["rft_kept"] = float(len(kept))
                self._finish_step([], metrics, ppo=False, trend_key="nll")
        # The KL term then holds PPO near the fine-tuned policy, not near the base model RFT moved from.
        self.workers.reset_reference()

    def _kept_nll(self, kept: list[Trajectory]) -> float:
        return policy_nll([episode_from_trajectory(t) for t in kept], self.workers.actor)

    def _value_stage(self) -> None:
        vp = self.spec.warmup.value_pretraining
        episodes = value_targets([t for t in self._rft_source() if learnable(t)])
        if not episodes:
            self._report(self._phase(), "value pretraining: no learnable warm-up trajectory; skipped")
            return
        while self.state.stage_step < vp.max_epochs and not self._value_converged():
            epoch = self.state.stage_step + 1
            with span(Stage.STEP, stage=self.state.stage, step=epoch):
                self._report(self._phase(), f"value pretraining epoch {epoch} (at most {vp.max_epochs})")
                metrics = value_pretraining_epoch(
                    episodes, self.workers.critic, self.spec, self._seed(self.state.stage_step)
                )
                self._finish_step([], metrics, ppo=False, trend_key="explained_variance")

    def _value_converged(self) -> bool:
        """True once `patience` epochs in a row improved the fit by less than minImprovement: explained
        variance rose by less than that, and the mean squared value error fell by less than that fraction.
        Both count: a fresh critic first learns the returns' mean, which explained variance does not see.
        Read from the history, so a resumed run stops where it would have."""
        vp = self.spec.warmup.value_pretraining
        history = [h for h in self.state.history if h["stage"] == VALUE_PRETRAINING]
        if not history:
            return False
        best_variance = float(history[0]["explained_variance_before"])
        best_error = float(history[0]["value_error_before"])
        stalled = 0
        for entry in history:
            variance, error = float(entry["explained_variance"]), float(entry["value_error"])
            improved = (
                variance - best_variance >= vp.min_improvement
                or best_error - error >= vp.min_improvement * best_error
            )
            stalled = 0 if improved else stalled + 1
            best_variance, best_error = max(best_variance, variance), min(best_error, error)
        return stalled >= vp.patience

    def _warmup_note(self, key: str) -> str:
        """'nll 10.79 -> 0.52 over 3 epochs': the stage's first value before and its latest after."""
        fit = stage_fit(self.state.history, self.state.stage, key)
        if fit is None:
            return ""
        before, after, epochs = fit[f"{key}_before"], fit[f"{key}_after"], int(fit["epochs"])
        return f"{key.replace('_', ' ')} {before:.4g} -> {after:.4g} over {epochs} epochs"

    # -- pieces ----------------------------------------------------------------------------------
    def _phase(self) -> TrainingRunPhase:
        return TrainingRunPhase.RUNNING if self.state.stage == PPO else TrainingRunPhase.WARMING_UP

    def _sync_weights(self) -> dict[str, float]:
        with span(Stage.WEIGHT_SYNC, stage=self.state.stage) as current:
            timings = self.workers.sync_weights(self.rollout)
            current.set_attribute("cuda_agent.weight_sync_gb", timings.get("weight_sync_gb", 0.0))
            return timings

    def _seed(self, step: int) -> int:
        return self.spec.trainer.seed * 1_000_003 + STAGES.index(self.state.stage) * 100_003 + step

    def _collect(self, max_turns: int, context: int, size: int | None = None) -> list[Trajectory]:
        stage, step = self.state.stage, self.state.stage_step
        size = size or self.spec.algorithm.batch_size
        position = self.state.data_position.get(stage, 0)
        request = RolloutRequest(
            stage=stage,
            step=step,
            tasks=self.order.batch(position, size),
            episode_ids=[f"{stage}-{step:06d}-{i:05d}" for i in range(size)],
            max_turns=max_turns,
            max_context_tokens=context,
            seed=self._seed(step) * 10_000,
        )
        trajectories = run_async(self.rollout.generate(request))  # one event loop for the whole run
        _link_episodes(trace.get_current_span(), trajectories)
        self._record(f"episodes/{stage}/step-{step:06d}.jsonl", trajectories)
        return trajectories

    def _rft_source(self) -> list[Trajectory]:
        """The warm-up trajectories: spec.warmup.rft.trajectoriesUri, else one batch of rollouts with the
        current policy. Recorded once, so value pretraining and a resumed run read the same set."""
        if self.rft_source is None:
            self.rft_source = self._load_rft_source()
            self.state.warmup_episodes = len(self.rft_source)
        return self.rft_source

    def _load_rft_source(self) -> list[Trajectory]:
        key = join_uri(self.checkpoints.prefix, "episodes/warmup-source.jsonl")
        store = open_store(key)
        if store.exists(key):
            lines = store.get_bytes(key).decode().splitlines()
            return [Trajectory.from_json(line) for line in lines if line.strip()]
        uri = self.spec.warmup.rft.trajectories_uri
        if uri:
            from cuda_agent.agent.records import read_trajectories

            source_store = open_store(uri)
            if uri.endswith(".jsonl"):
                lines = source_store.get_bytes(uri).decode().splitlines()
                source = [Trajectory.from_json(line) for line in lines if line.strip()]
            else:
                source = list(read_trajectories(uri, source_store))
        else:
            saved = self.state.stage
            self.state.stage = RFT
            source = self._collect(self.spec.agent.max_turns_train, self.spec.agent.max_context_tokens)
            self.state.stage = saved
        self._record("episodes/warmup-source.jsonl", source)
        return source

    def _record(self, relative: str, trajectories: list[Trajectory]) -> None:
        key = join_uri(self.checkpoints.prefix, relative)
        open_store(key).put_bytes(key, "".join(t.to_json() + "\n" for t in trajectories).encode())

    def _finish_step(
        self,
        trajectories: list[Trajectory],
        metrics: dict[str, float],
        ppo: bool,
        trend_key: str | None = None,
    ) -> None:
        stage = self.state.stage
        self.state.stage_step += 1
        if trajectories:
            self.state.data_position[stage] = self.state.data_position.get(stage, 0) + len(trajectories)
            self.state.episodes += len(trajectories)
        if ppo:
            self.state.ppo_step += 1
        self.state.history.append({"stage": stage, "step": self.state.stage_step, **metrics})
        # The step's span (the caller's) carries its metrics, so a trace shows how each update went.
        trace.get_current_span().set_attributes(span_attributes(metrics))
        record_step(
            stage,
            self.state.stage_step,
            metrics,
            generated_tokens=sum(sum(t.loss_mask) for t in trajectories),
            rollout_gpus=self.spec.resources.rollout_gpus or self.spec.resources.trainer_gpus,
        )
        # The metrics are fields of the line (JSON keys a log backend can query), not text in the message.
        log.info(
            "%s step %d done",
            stage,
            self.state.stage_step,
            extra=log_fields({"stage": stage, "step": self.state.stage_step, **metrics}),
        )
        every = self.spec.checkpoint.every_steps
        if self.state.stage_step % every == 0:
            self._checkpoint()
        message = f"{stage} step {self.state.stage_step} done"
        if trend_key is not None:  # a warm-up stage says how far it moved its fit, in status and logs
            message += f": {self._warmup_note(trend_key)}"
        self._report(self._phase(), message, metrics)
        if self.suspend_requested():
            if self.state.stage_step % every != 0:
                self._checkpoint()
            self._report(TrainingRunPhase.SUSPENDED, f"suspended after {stage} step {self.state.stage_step}")
            raise Stopped()

    def _checkpoint(self) -> None:
        self.last_checkpoint = self.checkpoints.save(self.state, self.workers.save)
        self.state.checkpoints += 1

    def _report(self, phase: TrainingRunPhase, message: str, metrics: dict[str, float] | None = None) -> None:
        summary = None
        if metrics and "reward" in metrics:
            summary = TrainingMetrics(
                mean_reward=max(-1.0, min(3.0, metrics["reward"])),
                pass_rate=metrics["pass_rate"],
                faster_than_compile_rate=metrics["faster_than_compile_rate"],
                clip_fraction=metrics.get("clip_fraction"),
                approx_kl=metrics.get("approx_kl"),
                entropy=metrics.get("entropy"),
                explained_variance=_bounded(metrics.get("explained_variance"), high=1.0),
            )
        progress = TrainerProgress(
            phase=phase,
            step=self.state.ppo_step,
            stage=self.state.stage or PPO,
            metrics=summary,
            last_checkpoint=self.last_checkpoint,
            message=message,
        )
        try:
            self.status.write(progress)
        except Exception:  # a status write must never kill training; the next report retries
            log.exception("status write failed")


def _link_episodes(step: trace.Span, trajectories: list[Trajectory]) -> None:
    """The step span's way to its episodes, each a trace of its own: a Link to each episode's root span
    (the SDK keeps the first OTEL_SPAN_LINK_COUNT_LIMIT, 128 by default) and every trace id as the
    attribute `cuda_agent.episode_trace_ids`. Each episode links back to the step in any case."""
    traced = [t for t in trajectories if t.trace_id and t.span_id]
    for trajectory in traced:
        assert trajectory.trace_id is not None and trajectory.span_id is not None
        link_to(step, trajectory.trace_id, trajectory.span_id)
    if traced:
        step.set_attribute("cuda_agent.episode_trace_ids", [str(t.trace_id) for t in traced])


def _bounded(value: float | None, high: float) -> float | None:
    return None if value is None else min(value, high)


def history_value(state: TrainerState, stage: str, step: int, key: str) -> Any:
    """One metric of one step from a state's history (tests and summaries)."""
    for entry in state.history:
        if entry["stage"] == stage and entry["step"] == step:
            return entry.get(key)
    return None

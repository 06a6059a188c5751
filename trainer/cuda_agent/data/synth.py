"""One synthesis run: compose candidates by index, filter them in batches, write each batch as a shard,
and at the end assemble the dataset (parquet + JSONL of accepted samples), the rejected samples and the
summary. Output layout under `out` (a path or s3:// prefix):

    shards/s<seed>-<first index>.jsonl   every candidate of one batch with its verdicts
    dataset.parquet, dataset.jsonl       the first N accepted samples, Ops-6K fields + verdicts
    rejected.jsonl                       rejected candidates with the verdict that rejected them
    summary.json                         Summary: counts, share of 1-5-op samples, rejections per filter

With calibration on (the default on cuda), each batch is re-sized for the target device before it is
filtered (calibrate.py). Resumable: candidate ids are a function of (seed, index), so a rerun reads the
shards, skips the ids already there and continues where the previous run stopped.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cuda_agent.api.judge import Device
from cuda_agent.data.calibrate import Measurement, Window, calibrate, outcome_counts
from cuda_agent.data.compose import Composer, EndpointConfig, ProgrammaticComposer, sample_id
from cuda_agent.data.decontam import BenchmarkIndex
from cuda_agent.data.pipeline import filter_samples, measure_tasks
from cuda_agent.data.published import jsonl, ops6k_parquet, read_jsonl, write_bytes
from cuda_agent.data.records import (
    CalibrationConfig,
    ComposerConfig,
    FilterConfig,
    Sample,
    Summary,
)
from cuda_agent.storage import ObjectNotFoundError, join_uri, open_store


class SynthConfig(BaseModel):
    """`cuda-agent data synth` as a config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(ge=1, description="accepted samples wanted")
    out: str = Field(description="directory or s3:// prefix")
    composer: Literal["programmatic", "llm"] = "programmatic"
    seed: int = 0
    device: Device = "cpu"
    workers: int = Field(default=1, ge=1, le=1024)
    use_ray: bool = False
    sandbox_url: str | None = Field(
        default=None, description="run the execution filters in this sandbox server"
    )
    benchmark: str | None = Field(default=None, description="KernelBench-layout set to decontaminate against")
    max_candidates: int | None = Field(default=None, ge=1, description="default: 20 * n")
    batch_size: int = Field(default=16, ge=1)
    filters: FilterConfig = Field(default_factory=FilterConfig)
    composing: ComposerConfig = Field(default_factory=ComposerConfig)
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    endpoint: EndpointConfig | None = None

    @model_validator(mode="after")
    def _llm_needs_endpoint(self) -> SynthConfig:
        if self.composer == "llm" and self.endpoint is None:
            raise ValueError("composer llm needs endpoint (base_url and model)")
        if self.filters.device != self.device:
            raise ValueError(f"filters.device {self.filters.device} differs from device {self.device}")
        return self

    @property
    def candidate_limit(self) -> int:
        return self.max_candidates or 20 * self.n


def shard_uri(out: str, first_id: str) -> str:
    return join_uri(out, f"shards/{first_id}.jsonl")


def load_existing(out: str) -> dict[str, Sample]:
    """Samples of the shards already written under `out`, by id."""
    store = open_store(out)
    prefix = join_uri(out, "shards/")
    found: dict[str, Sample] = {}
    try:
        listing = list(store.list_objects(prefix))
    except ObjectNotFoundError:
        return found
    for info in listing:
        if info.uri.endswith(".jsonl"):
            for sample in read_jsonl(store.get_bytes(info.uri), info.uri):
                found[sample.id] = sample
    return found


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {f"p{p}": ordered[min(len(ordered) - 1, len(ordered) * p // 100)] for p in (10, 50, 90)}


def summarize(candidates: list[Sample], accepted: list[Sample], config: SynthConfig) -> Summary:
    counts = Counter(min(s.n_ops, 5) for s in accepted)
    timed = [v.value for s in candidates for v in s.verdicts if v.filter == "runtime" and v.value is not None]
    total = max(1, len(accepted))
    rejections = Counter(s.rejected_by for s in candidates if s.rejected_by is not None)
    return Summary(
        candidates=len(candidates),
        passed=sum(1 for s in candidates if s.accepted),
        accepted=len(accepted),
        ops_share={str(k): counts.get(k, 0) / total for k in range(1, 6)},
        rejections={name: rejections.get(name, 0) for name in config.filters.enabled},
        runtime_ms=_percentiles(timed),
        calibration=outcome_counts(candidates),
        device=config.device,
        composer=config.composer,
        seed=config.seed,
    )


Progress = Callable[[int], None]


def run(
    config: SynthConfig,
    composer: Composer,
    benchmark: BenchmarkIndex | None = None,
    progress: Progress | None = None,
) -> Summary:
    """Compose and filter until `config.n` samples are accepted or `candidate_limit` indices are used;
    `progress(k)` is called with the number of newly accepted samples after each batch."""
    done = load_existing(config.out)
    accepted = sum(1 for s in done.values() if s.accepted)
    if progress:
        progress(min(accepted, config.n))
    index = 0
    while accepted < config.n and index < config.candidate_limit:
        batch: list[Sample] = []
        indices: list[int] = []
        while len(batch) < config.batch_size and index < config.candidate_limit:
            if sample_id(config.seed, index) not in done:
                batch.append(composer.compose(index))
                indices.append(index)
            index += 1
        if not batch:
            continue
        if config.calibration.enabled and isinstance(composer, ProgrammaticComposer):
            batch = _calibrate(config, composer, indices, batch)
        results = list(
            filter_samples(
                batch,
                config.filters,
                benchmark,
                workers=config.workers,
                use_ray=config.use_ray,
                sandbox_url=config.sandbox_url,
            )
        )
        # Named by its first sample: a resumed run's batches never overwrite an earlier shard.
        write_bytes(shard_uri(config.out, batch[0].id), jsonl(results))
        done.update((s.id, s) for s in results)
        new = sum(1 for s in results if s.accepted)
        if progress:
            progress(max(0, min(new, config.n - accepted)))
        accepted += new
    return finalize(config, done)


def _calibrate(
    config: SynthConfig, composer: ProgrammaticComposer, indices: list[int], batch: list[Sample]
) -> list[Sample]:
    """The batch re-sized for the target device (calibrate.py), measured where the filters would run;
    with --sandbox the measuring runs locally, since only the programmatic composer's code is sized."""

    def measure(codes: list[str]) -> list[Measurement]:
        return measure_tasks(codes, config.filters, workers=config.workers, use_ray=config.use_ray)

    window = Window(config.filters.min_runtime_ms, config.filters.max_runtime_ms)
    return calibrate(composer, indices, batch, measure, window, config.calibration)


def finalize(config: SynthConfig, done: dict[str, Sample]) -> Summary:
    """Write dataset, rejected samples and summary from every candidate so far (sorted by id)."""
    candidates = [done[key] for key in sorted(done)]
    accepted = [s for s in candidates if s.accepted][: config.n]
    rejected = [s for s in candidates if not s.accepted]
    summary = summarize(candidates, accepted, config)
    write_bytes(join_uri(config.out, "dataset.parquet"), ops6k_parquet(accepted))
    write_bytes(join_uri(config.out, "dataset.jsonl"), jsonl(accepted))
    write_bytes(join_uri(config.out, "rejected.jsonl"), jsonl(rejected))
    write_bytes(join_uri(config.out, "summary.json"), summary.model_dump_json(indent=2).encode() + b"\n")
    return summary


def benchmark_index(uri: str | None) -> BenchmarkIndex | None:
    from cuda_agent.data.published import read_kernelbench

    if uri is None:
        return None
    return BenchmarkIndex((task.name, task.code) for task in read_kernelbench(uri))


def write_catalogue(path: str, entries: list[object]) -> None:
    """The catalogue as JSON (one object per operator), for `cuda-agent data catalogue`."""
    text = json.dumps([e.model_dump(mode="json") for e in entries if isinstance(e, BaseModel)], indent=1)
    write_bytes(path, text.encode() + b"\n")

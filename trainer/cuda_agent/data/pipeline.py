"""Fan-out of the filters: samples are evaluated in the calling process (`workers=1`), in a pool of
spawned processes (`workers=N`), as Ray tasks (`use_ray`), or in sandbox sessions (`sandbox_url`: a
sandbox server or the Service of a SandboxPool). All Ray and sandbox plumbing lives here.

The execution filters run the task's code. Code from the programmatic composer is ours; code from an LLM
composer is not, and belongs in the sandbox, where it runs confined like agent code: the static filters
run here, execution.py is copied into a fresh session next to the task (model.py) and run there with the
sandbox's interpreter. Local workers limit torch to one thread so N workers time N tasks without
contending.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cuda_agent.data import execution
from cuda_agent.data.calibrate import Measurement
from cuda_agent.data.decontam import BenchmarkIndex
from cuda_agent.data.filters import conclude, evaluate, execution_settings, static_verdicts
from cuda_agent.data.records import FilterConfig, Sample, Verdict

# Seconds one sample's execution filters may take inside a sandbox session (torch.compile included).
SANDBOX_FILTER_TIMEOUT_S = 600.0


def _evaluate_in_worker(sample: Sample, config: FilterConfig, benchmark: BenchmarkIndex | None) -> Sample:
    import torch

    torch.set_num_threads(1)
    return evaluate(sample, config, benchmark)


def filter_samples(
    samples: Sequence[Sample],
    config: FilterConfig,
    benchmark: BenchmarkIndex | None = None,
    *,
    workers: int = 1,
    use_ray: bool = False,
    sandbox_url: str | None = None,
) -> Iterator[Sample]:
    """Evaluated samples, in the order given."""
    if sandbox_url:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as threads:
            yield from threads.map(lambda s: evaluate_in_sandbox(s, config, benchmark, sandbox_url), samples)
    elif use_ray:
        yield from _with_ray(samples, config, benchmark, workers)
    elif workers <= 1:
        for sample in samples:
            yield evaluate(sample, config, benchmark)
    else:
        # spawn, not fork: the parent may hold torch threads and a CUDA context a fork would corrupt.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            count = len(samples)
            yield from pool.map(_evaluate_in_worker, samples, [config] * count, [benchmark] * count)


def _init_ray(workers: int) -> None:
    import ray

    if not ray.is_initialized():
        # An existing cluster when RAY_ADDRESS says so, else a local one limited to `workers` CPUs.
        address = os.environ.get("RAY_ADDRESS")
        ray.init(address=address, num_cpus=None if address else max(1, workers), include_dashboard=False)


def _with_ray(
    samples: Sequence[Sample], config: FilterConfig, benchmark: BenchmarkIndex | None, workers: int
) -> Iterator[Sample]:
    import ray

    _init_ray(workers)
    gpus = 1.0 if config.device == "cuda" else 0.0
    remote: Any = ray.remote(num_cpus=1, num_gpus=gpus)(_evaluate_in_worker)
    config_ref, bench_ref = ray.put(config), ray.put(benchmark)
    refs = [remote.remote(sample, config_ref, bench_ref) for sample in samples]
    for ref in refs:
        result: Sample = ray.get(ref)
        yield result


def _measure_in_worker(code: str, settings: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    return execution.measure(code, settings)


def measure_tasks(
    codes: Sequence[str], config: FilterConfig, *, workers: int = 1, use_ray: bool = False
) -> list[Measurement]:
    """execution.measure over tasks (the calibration's measurements), fanned out like the filters: in
    this process, in spawned workers, or as Ray tasks (one GPU each on cuda). Only for the programmatic
    composer's own code, which is why there is no sandbox path: a model's code is never calibrated."""
    settings = execution_settings(config)
    if use_ray:
        import ray

        _init_ray(workers)
        gpus = 1.0 if config.device == "cuda" else 0.0
        remote: Any = ray.remote(num_cpus=1, num_gpus=gpus)(_measure_in_worker)
        raw = ray.get([remote.remote(code, settings) for code in codes])
    elif workers <= 1:
        raw = [execution.measure(code, settings) for code in codes]
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            raw = list(pool.map(_measure_in_worker, codes, [settings] * len(codes)))
    return [Measurement.model_validate(r) for r in raw]


def evaluate_in_sandbox(
    sample: Sample, config: FilterConfig, benchmark: BenchmarkIndex | None, sandbox_url: str
) -> Sample:
    """`evaluate`, with the execution filters run in a session of the sandbox server at `sandbox_url`."""
    from cuda_agent.sandbox.client import SandboxError, SyncSandboxClient

    if sample.rejected_by is not None:
        return sample
    verdicts = static_verdicts(sample, config, benchmark)
    if not all(v.passed for v in verdicts) or not set(execution.EXECUTION_FILTERS) & set(config.enabled):
        return conclude(sample, verdicts)
    client = SyncSandboxClient(sandbox_url, timeout_s=SANDBOX_FILTER_TIMEOUT_S + 60)
    try:
        session = client.create_session(sample.code, device=config.device, name="data-filter")
    except SandboxError as exc:
        raise RuntimeError(f"sandbox {sandbox_url} refused a session for {sample.id}: {exc}") from exc
    try:
        client.tool(session.session_id, "write", {"file_path": "data_filter.py", "content": _RUNNER})
        settings = json.dumps(execution_settings(config))
        client.tool(session.session_id, "write", {"file_path": "data_filter.json", "content": settings})
        command = "python data_filter.py data_filter.json model.py"
        result = client.tool(
            session.session_id, "bash", {"command": command, "timeout": SANDBOX_FILTER_TIMEOUT_S * 1000}
        )
    finally:
        client.delete_session(session.session_id)
    last = result.output.strip().splitlines()[-1] if result.output.strip() else ""
    try:
        executed = [Verdict.model_validate(v) for v in json.loads(last)]
    except ValueError:
        # The runner died (killed at the timeout, out of memory, a crash in native code): the task
        # did not run to completion, so it fails runs_eager with what the session printed.
        detail = f"sandbox run failed: {result.output.strip()[-300:]}"
        executed = [Verdict(filter="runs_eager", passed=False, detail=detail)]
    return conclude(sample, verdicts + executed)


_RUNNER = Path(execution.__file__).read_text()

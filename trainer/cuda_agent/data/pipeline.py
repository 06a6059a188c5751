"""Fan-out of the filters: samples are evaluated in the calling process (`workers=1`), in a pool of
spawned processes (`workers=N`), or as Ray tasks (`use_ray`). All Ray plumbing lives here.

Filters execute the task code, so they never run in the process that holds credentials for anything
that matters; on a cluster the intended home is the sandbox pool (documented in docs/data.md, not built
here). Each worker limits torch to one thread so that N workers time N tasks without contending.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from cuda_agent.data.decontam import BenchmarkIndex
from cuda_agent.data.filters import evaluate
from cuda_agent.data.records import FilterConfig, Sample


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
) -> Iterator[Sample]:
    """Evaluated samples, in the order given."""
    if use_ray:
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


def _with_ray(
    samples: Sequence[Sample], config: FilterConfig, benchmark: BenchmarkIndex | None, workers: int
) -> Iterator[Sample]:
    import ray

    if not ray.is_initialized():
        # An existing cluster when RAY_ADDRESS says so, else a local one limited to `workers` CPUs.
        address = os.environ.get("RAY_ADDRESS")
        ray.init(address=address, num_cpus=None if address else max(1, workers), include_dashboard=False)
    gpus = 1.0 if config.device == "cuda" else 0.0
    remote: Any = ray.remote(num_cpus=1, num_gpus=gpus)(_evaluate_in_worker)
    config_ref, bench_ref = ray.put(config), ray.put(benchmark)
    refs = [remote.remote(sample, config_ref, bench_ref) for sample in samples]
    for ref in refs:
        result: Sample = ray.get(ref)
        yield result

"""Multi-GPU training of one long sequence: Ulysses sequence parallelism + ZeRO-3 (the trainer's own
PolicyActor, `spec.resources.sequenceParallelSize` = GPUs), a 7B-class random-init policy.

For every (GPUs, tokens) pair one `torchrun` job runs PPO train steps on one sequence (forward, backward,
AdamW step): tokens/s/GPU and peak memory per GPU. The single-GPU run of the same length is the baseline
(measured in the same invocation, one job before): scaling efficiency = tokens/s/GPU on N GPUs / on 1.
Then the longest length that trains on the most GPUs (tried longest first), and the weight sync of the
trained policy: rank 0 gathers the ZeRO-3 partitions in 512 MB buckets (`PolicyActor.weight_buckets`) and
copies each into a rollout copy of the model on the last GPU (device to device), timed.

  PYTHONPATH=/tmp/site:platform:trainer:sandbox_image PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      python3 bench/sequence_parallel.py --out $OUT            # 2 GPUs: --gpus 1,2 (default)

Needs deepspeed and pydantic (carried as wheels where absent; docs/performance.md). Every job writes a
JSON line to $OUT/sequence_parallel.jsonl as it ends, so a run cut short keeps what finished.
`--lengths`, `--longest`, `--gpus`, `--no-sync` pick parts when one call cannot run them all; `--model`
takes several shapes (`1.5b,7b`), run one after the other. A length is skipped once a shorter one ran out
of memory on as many GPUs. `--job-timeout` ends a job (torchrun and its ranks, one process group) past its
time, `--deadline` skips the jobs that would start past it, and a SIGTERM (the caller's `timeout`) ends the
running job: each still prints the table. With `--gpus 1` only the single-GPU baselines run (no sync).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHUNK = 8192
PROMPT = 1024


# -- one rank of one torchrun job --------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(HERE))
    from _trainer_common import is_oom, peak_gib, qwen2_config, run_spec, timed
    from transformers import AutoModelForCausalLM

    from cuda_agent.trainer.experience import Episode
    from cuda_agent.trainer.models import Policy, enable_checkpointing
    from cuda_agent.trainer.roles import PolicyActor
    from cuda_agent.trainer.weight_sync import load_bucket, sync_weights

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpu = torch.cuda.is_available()  # without one: a CPU smoke run of the tiny shape (gloo, fp32)
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    length = args.tokens
    row: dict[str, Any] = {"model": args.model, "gpus": world, "tokens": length}
    config = qwen2_config(args.model, length + 1)
    auto: Any = AutoModelForCausalLM
    try:
        spec = run_spec(
            microBatchTokens=length,
            logitsChunkTokens=CHUNK,
            engine="deepspeed",
            zeroStage=3,
            precision="bf16" if gpu else "fp32",
        )
        spec = spec.model_copy(
            update={
                "resources": spec.resources.model_copy(
                    update={"trainer_gpus": world, "sequence_parallel_size": world}
                )
            }
        )
        torch.manual_seed(0)
        with device:
            lm = auto.from_config(config, dtype=dtype, attn_implementation="sdpa")
        enable_checkpointing(lm, spec.trainer)
        actor = PolicyActor(spec, device, Policy(lm, CHUNK))
        del lm
        g = torch.Generator().manual_seed(length)
        mask = torch.zeros(length - 1)
        mask[PROMPT - 1 :] = 1
        episode = Episode(
            "bench",
            torch.randint(0, config.vocab_size, (length,), generator=g),
            mask,
            torch.zeros(length - 1),
            1.0,
            True,
            False,
        )
        episode.advantages = torch.randn(length - 1, generator=g) * mask
        actor.compute_logprobs([episode])
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        times = [timed(lambda: actor.train_ppo([episode], [[0]]))[0] for _ in range(args.steps)]
        row.update(
            status="ok",
            step_s=[round(t, 2) for t in times],
            tokens_per_s_per_gpu=round(length / min(times) / world),
            peak_gib=round(peak_gib(), 1),
        )
        if args.weight_sync:
            # The rollout copy lives on the last GPU; every rank takes part in the ZeRO-3 gathers.
            target = torch.device("cuda", torch.cuda.device_count() - 1) if gpu else device
            rollout = None
            if rank == 0:
                rollout = auto.from_config(config, dtype=dtype).to(target).eval()

            class Receiver:
                def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
                    if rollout is not None:
                        load_bucket(rollout, bucket)

            syncs = [sync_weights(actor.weight_buckets(512 << 20), Receiver()) for _ in range(3)]
            row["weight_sync"] = {
                "to": str(target),
                "seconds": [round(s["weight_sync_s"], 3) for s in syncs],
                "buckets": syncs[-1]["weight_sync_buckets"],
                "gb": round(syncs[-1]["weight_sync_gb"], 2),
            }
    except Exception as exc:  # out of memory is a result here
        row.update(status="out of memory" if is_oom(exc) else f"error: {type(exc).__name__}: {exc}"[:300])
        row["peak_gib"] = round(peak_gib(), 1)
    if rank == 0:
        with open(args.result, "a") as out:
            out.write(json.dumps(row) + "\n")


# -- the launcher: one torchrun job per configuration ------------------------------------------------
class Stopped(Exception):
    """SIGTERM (the caller's `timeout`): the running job is ended and the table printed with what finished."""


def _stop(signum: int, frame: Any) -> None:
    raise Stopped


def run_job(command: list[str], log_path: Path, timeout: float) -> str:
    """Run one torchrun job in its own process group (not its own session: a machine's clean-up still ends
    it), so a job past its time or a SIGTERM ends torchrun and its ranks together; returns how it ended."""
    with open(log_path, "w") as log:
        job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, process_group=0)
        try:
            return f"exit {job.wait(timeout=timeout)}"
        except (subprocess.TimeoutExpired, Stopped) as exc:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    job.wait(timeout=10)
            if isinstance(exc, Stopped):
                raise
            return f"timed out after {timeout:.0f} s"


def launch(args: argparse.Namespace, model: str, gpus: int, tokens: int, sync: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"model": model, "gpus": gpus, "tokens": tokens}
    oom = [
        r for r in args.rows if r["model"] == model and r["gpus"] == gpus and r["status"] == "out of memory"
    ]
    if any(r["tokens"] <= tokens for r in oom):  # memory grows with length: a longer one cannot fit
        row["status"] = f"skipped: out of memory at {min(r['tokens'] for r in oom):,}"
        return row
    left = args.deadline - (time.monotonic() - args.started) if args.deadline else float("inf")
    if left < 30:  # too little for a job to start and step
        row["status"] = "skipped: deadline"
        return row
    result = args.out / "sequence_parallel.jsonl"
    before = result.read_text().count("\n") if result.exists() else 0
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
        str(Path(__file__).resolve()), "--worker", "--model", model, "--tokens", str(tokens),
        "--steps", str(args.steps), "--result", str(result), *(["--weight-sync"] if sync else []),
    ]  # fmt: skip
    start = time.perf_counter()
    name = f"job-{model}-{gpus}gpu-{tokens}{'-sync' if sync else ''}.log"
    try:
        ended = run_job(command, args.out / name, min(args.job_timeout, left))
    except Stopped:
        ended = "stopped (SIGTERM)"
        args.stopped = True
    lines = result.read_text().splitlines() if result.exists() else []
    if len(lines) > before:
        row = json.loads(lines[-1])
    else:
        row["status"] = f"no result ({ended}; see {name})"
    row["job_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(row), flush=True)
    return row


def plan(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """One model's jobs: every length on every GPU count, the longest on the most GPUs, the weight sync."""
    gpus = sorted(int(g) for g in args.gpus.split(",") if g)
    lengths = [int(n) for n in args.lengths.split(",") if n]
    most = gpus[-1]

    def run(count: int, tokens: int, sync: bool = False) -> dict[str, Any]:
        row = launch(args, model, count, tokens, sync) if not args.stopped else {}
        row = row or {"model": model, "gpus": count, "tokens": tokens, "status": "skipped: stopped"}
        if not sync:
            args.rows.append(row)
        return row

    for n in lengths:
        for g in gpus:
            run(g, n)
    mine = [r for r in args.rows if r["model"] == model and r["gpus"] == most]
    longest = max((r["tokens"] for r in mine if r["status"] == "ok"), default=0)
    for n in sorted((int(x) for x in args.longest.split(",") if x), reverse=True):
        if n <= longest:
            break
        if run(most, n)["status"] == "ok":
            longest = n
            break
    sync_row = run(most, lengths[0], True) if args.sync and most > 1 else {}
    sync = sync_row.get("weight_sync", sync_row.get("status"))
    return {"model": model, f"longest_on_{most}_gpus": longest, "weight_sync": sync}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model", default="7b", help="7b, or a bench/_trainer_common.py shape (1.5b, tiny); several: 1.5b,7b"
    )
    parser.add_argument("--gpus", default="1,2", help="GPU counts; the largest also runs --longest")
    parser.add_argument("--lengths", default="32768,131072")
    parser.add_argument("--longest", default="262144,196608", help="tried longest first on the most GPUs")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--no-sync", dest="sync", action="store_false")
    parser.add_argument("--job-timeout", type=int, default=900, help="seconds one job may run")
    parser.add_argument(
        "--deadline",
        type=int,
        default=0,
        help="seconds for the whole run: later jobs are skipped, the table kept",
    )
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--weight-sync", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    args.started, args.rows, args.stopped = time.monotonic(), [], False
    signal.signal(signal.SIGTERM, _stop)
    summaries = []
    for model in (m for m in args.model.split(",") if m):
        try:
            summaries.append(plan(args, model))
        except Stopped:  # between two jobs: the later ones are skipped
            args.stopped = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the table, at least, is printed

    print("\n| model | GPUs | tokens | status | step s | tokens/s/GPU | scaling vs 1 GPU | peak GiB/GPU |")
    print("|---|---|---|---|---|---|---|---|")
    single = {(r["model"], r["tokens"]): r for r in args.rows if r["gpus"] == 1 and r["status"] == "ok"}
    for r in args.rows:
        base = single.get((r["model"], r["tokens"]))
        efficiency = ""
        if base and r["status"] == "ok" and r["gpus"] > 1:
            efficiency = f"{r['tokens_per_s_per_gpu'] / base['tokens_per_s_per_gpu']:.2f}"
        print(
            f"| {r['model']} | {r['gpus']} | {r['tokens']:,} | {r['status']} | {r.get('step_s', '')} "
            f"| {r.get('tokens_per_s_per_gpu', '')} | {efficiency} | {r.get('peak_gib', '')} |"
        )
    for summary in summaries:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

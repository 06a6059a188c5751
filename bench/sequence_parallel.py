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
`--lengths`, `--longest`, `--gpus`, `--no-sync` pick parts when one call cannot run them all.
"""

from __future__ import annotations

import argparse
import json
import os
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
def launch(args: argparse.Namespace, gpus: int, tokens: int, sync: bool) -> dict[str, Any]:
    result = args.out / "sequence_parallel.jsonl"
    before = result.read_text().count("\n") if result.exists() else 0
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
        str(Path(__file__).resolve()), "--worker", "--model", args.model, "--tokens", str(tokens),
        "--steps", str(args.steps), "--result", str(result), *(["--weight-sync"] if sync else []),
    ]  # fmt: skip
    start = time.perf_counter()
    name = f"job-{gpus}gpu-{tokens}{'-sync' if sync else ''}.log"
    with open(args.out / name, "w") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, timeout=args.job_timeout)
    lines = result.read_text().splitlines() if result.exists() else []
    row = json.loads(lines[-1]) if len(lines) > before else {"gpus": gpus, "tokens": tokens}
    if len(lines) == before:
        row["status"] = f"no result (exit {code}; see {name})"
    row["job_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="7b", help="7b, or a bench/_trainer_common.py shape (1.5b, tiny)")
    parser.add_argument("--gpus", default="1,2", help="GPU counts; the largest also runs --longest")
    parser.add_argument("--lengths", default="32768,131072")
    parser.add_argument("--longest", default="262144,196608", help="tried longest first on the most GPUs")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--no-sync", dest="sync", action="store_false")
    parser.add_argument("--job-timeout", type=int, default=900)
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
    gpus = [int(g) for g in args.gpus.split(",") if g]
    lengths = [int(n) for n in args.lengths.split(",") if n]
    rows = [launch(args, g, n, False) for n in lengths for g in sorted(gpus)]
    most = max(gpus)
    longest = max((r["tokens"] for r in rows if r["gpus"] == most and r["status"] == "ok"), default=0)
    for n in sorted((int(x) for x in args.longest.split(",") if x), reverse=True):
        if n <= longest:
            break
        row = launch(args, most, n, False)
        rows.append(row)
        if row["status"] == "ok":
            longest = n
            break
    sync_row = launch(args, most, lengths[0], True) if args.sync and most > 1 else {}

    print("\n| GPUs | tokens | status | step s | tokens/s/GPU | scaling vs 1 GPU | peak GiB/GPU |")
    print("|---|---|---|---|---|---|---|")
    single = {r["tokens"]: r for r in rows if r["gpus"] == 1 and r["status"] == "ok"}
    for r in rows:
        base = single.get(r["tokens"])
        efficiency = ""
        if base and r["status"] == "ok" and r["gpus"] > 1:
            efficiency = f"{r['tokens_per_s_per_gpu'] / base['tokens_per_s_per_gpu']:.2f}"
        print(
            f"| {r['gpus']} | {r['tokens']:,} | {r['status']} | {r.get('step_s', '')} "
            f"| {r.get('tokens_per_s_per_gpu', '')} | {efficiency} | {r.get('peak_gib', '')} |"
        )
    sync = sync_row.get("weight_sync", sync_row.get("status"))
    print(json.dumps({"model": args.model, f"longest_on_{most}_gpus": longest, "weight_sync": sync}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

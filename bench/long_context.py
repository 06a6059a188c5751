"""Long-context training on one GPU: the longest sequence a 1.5B-class policy trains on with the optimizer
step, and train-step tokens/s at 131,072 tokens against plain Hugging Face + chunked loss, same run.

  ours      PolicyActor.train_ppo (cuda_agent.trainer.roles): hidden states -> fp32 log-probs in
            checkpointed chunks, selective activation checkpointing that keeps attention outputs, clip-higher
            PPO loss, AdamW step. Variants: SDPA auto and cuDNN attention (--backends); every layer
            checkpointed or spec.trainer.checkpointedLayers absent, the fewest checkpointed layers that
            fit the GPU's free memory (--checkpointing all,auto).
  baseline  the same Qwen2 model from transformers with its own gradient checkpointing (whole layers
            recomputed), hidden states -> logits + the same PPO loss in checkpointed chunks of 8,192 tokens,
            AdamW step: "plain HF + chunked loss" of ../shared/MEASUREMENTS.md.
Both: bf16 weights, one sequence per step, a 1,024-token prompt, every later token a policy token.
Then the weight-sync time of the 1.5B policy into a second (rollout) copy on the same GPU, 512 MB buckets.

  PYTHONPATH=platform:trainer:sandbox_image python3 bench/long_context.py [--model 1.5b] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from _trainer_common import device, is_oom, peak_gib, qwen2_config, reset_memory, run_spec, timed

from cuda_agent.trainer.experience import Episode
from cuda_agent.trainer.models import (
    Policy,
    attention_implementation,
    enable_checkpointing,
    set_attention_backend,
)
from cuda_agent.trainer.roles import PolicyActor
from cuda_agent.trainer.weight_sync import load_bucket, sync_weights

PROMPT = 1024
CHUNK = 8192


def make_lm(model: str, length: int, attention: str = "sdpa") -> Any:
    torch.manual_seed(0)
    with torch.device(device()):
        lm = AutoModelForCausalLM.from_config(
            qwen2_config(model, length + 1), dtype=torch.bfloat16, attn_implementation=attention
        )
    return lm


def episode(length: int, vocab: int) -> Episode:
    g = torch.Generator().manual_seed(length)
    ids = torch.randint(0, vocab, (length,), generator=g)
    mask = torch.zeros(length - 1)
    mask[PROMPT - 1 :] = 1
    e = Episode("bench", ids, mask, torch.zeros(length - 1), 1.0, True, False)
    e.advantages = torch.randn(length - 1, generator=g) * mask
    return e


LAYERS: dict[str, dict[str, Any]] = {"all": {"checkpointedLayers": 1000}, "auto": {}}


def ours(model: str, length: int, steps: int, backend: str, layers: str = "all") -> dict[str, Any]:
    spec = run_spec(
        microBatchTokens=length, logitsChunkTokens=CHUNK, attentionBackend=backend, **LAYERS[layers]
    )
    set_attention_backend(spec.trainer)
    lm = make_lm(model, length, attention_implementation(spec.trainer))
    enable_checkpointing(lm, spec.trainer)
    actor = PolicyActor(spec, device(), Policy(lm, CHUNK))
    episodes = [episode(length, lm.config.vocab_size)]
    actor.compute_logprobs(episodes)
    times = []
    for _ in range(steps):
        seconds, _ = timed(lambda: actor.train_ppo(episodes, [[0]]))
        times.append(seconds)
    return {"actor": actor, "times": times, "checkpointed": actor.layer_plan.count}


def baseline(model: str, length: int, steps: int) -> dict[str, Any]:
    lm = make_lm(model, length)
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()
    opt = torch.optim.AdamW(lm.parameters(), lr=3e-6, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    e = episode(length, lm.config.vocab_size)
    ids, mask, adv = e.input_ids[None].to(device()), e.mask.to(device()), e.advantages.to(device())
    head = lm.get_output_embeddings()

    def chunk_loss(h: torch.Tensor, t: torch.Tensor, m: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(head(h).float(), -1).gather(-1, t[:, None])[:, 0]
        ratio = torch.exp(logp - logp.detach())
        return -(torch.minimum(ratio * a, ratio.clamp(0.8, 1.28) * a) * m).sum()

    def step() -> None:
        hidden = lm.model(input_ids=ids).last_hidden_state[0, :-1]
        targets = ids[0, 1:]
        loss = torch.zeros((), device=ids.device)
        for s in range(0, hidden.shape[0], CHUNK):
            sl = slice(s, s + CHUNK)
            loss = loss + checkpoint(
                chunk_loss, hidden[sl], targets[sl], mask[sl], adv[sl], use_reentrant=False
            )
        (loss / mask.sum()).backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = [timed(step)[0] for _ in range(steps)]
    return {"times": times}


def restore_sdpa() -> None:
    """PyTorch's default SDPA kernels again (set_attention_backend changes them process-wide)."""
    for enable in (
        torch.backends.cuda.enable_flash_sdp,
        torch.backends.cuda.enable_mem_efficient_sdp,
        torch.backends.cuda.enable_cudnn_sdp,
        torch.backends.cuda.enable_math_sdp,
    ):
        enable(True)


def attempt(label: str, fn: Any, length: int, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    reset_memory()
    try:
        result = fn()
    except Exception as exc:  # an OOM (or a kernel a variant cannot run) is a result here, not a crash
        if not is_oom(exc):
            status = f"error: {type(exc).__name__}: {exc}"[:300]
            rows.append({"run": label, "tokens": length, "status": status, "peak_gib": round(peak_gib(), 1)})
            print(json.dumps(rows[-1]), flush=True)
            return None
        rows.append(
            {"run": label, "tokens": length, "status": "out of memory", "peak_gib": round(peak_gib(), 1)}
        )
        print(json.dumps(rows[-1]), flush=True)
        return None
    best = min(result["times"])
    rows.append(
        {
            "run": label,
            "tokens": length,
            "status": "ok",
            "step_s": [round(t, 2) for t in result["times"]],
            "tokens_per_s": round(length / best),
            "peak_gib": round(peak_gib(), 1),
            **({"checkpointed": result["checkpointed"]} if "checkpointed" in result else {}),
        }
    )
    print(json.dumps(rows[-1]), flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="1.5b")
    parser.add_argument("--compare-length", type=int, default=131_072)
    parser.add_argument("--max-lengths", default="196608,262144")  # longest that trains is reported
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--backends", default="auto,cudnn", help="spec.trainer.attentionBackend values to compare"
    )
    parser.add_argument("--checkpointing", default="all", help="all and/or auto (checkpointed layers)")
    parser.add_argument("--no-sync", action="store_true", help="skip the weight-sync measurement")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    n = args.compare_length

    attempt("baseline HF + chunked loss", lambda: baseline(args.model, n, args.steps), n, rows)
    for backend in args.backends.split(","):
        for layers in args.checkpointing.split(","):
            attempt(
                f"ours (attention {backend}, checkpointed {layers})",
                lambda b=backend, c=layers: ours(args.model, n, args.steps, b, c),
                n,
                rows,
            )
            restore_sdpa()
    ok = [r for r in rows if r["status"] == "ok" and r["run"].startswith("ours") and r["tokens"] == n]
    best_backend = (
        max(ok, key=lambda r: r["tokens_per_s"])["run"][len("ours (attention ") :].split(",")[0]
        if ok
        else "auto"
    )
    # The longest first: a length that trains needs no shorter one tried.
    longest = 0
    for length in sorted((int(x) for x in args.max_lengths.split(",") if x), reverse=True):
        label = f"ours (attention {best_backend})"
        trained = attempt(label, lambda L=length: ours(args.model, L, 1, best_backend), length, rows)
        restore_sdpa()
        if trained:
            longest = length
            break

    # Weight sync of the policy into a rollout copy on the same device.
    sync_row: dict[str, Any] = {"run": "weight sync", "status": "not run (--no-sync)"}
    if not args.no_sync:
        reset_memory()
        result = ours(args.model, 4096, 1, "auto")
        actor = result["actor"]
        rollout = make_lm(args.model, 4096).eval()

        class Receiver:
            def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
                load_bucket(rollout, bucket)

        syncs = [
            timed(lambda: sync_weights(actor.weight_buckets(512 << 20), Receiver()))[1] for _ in range(3)
        ]
        for name, p in rollout.named_parameters():
            assert torch.equal(p, dict(actor.module.lm.named_parameters())[name]), name
        sync_row = {
            "run": "weight sync",
            "seconds": [round(s["weight_sync_s"], 3) for s in syncs],
            "buckets": syncs[-1]["weight_sync_buckets"],
            "gb": round(syncs[-1]["weight_sync_gb"], 2),
        }
        rows.append(sync_row)

    base = next((r for r in rows if r["run"].startswith("baseline") and r["status"] == "ok"), None)
    best = max(ok, key=lambda r: r["tokens_per_s"]) if ok else None
    summary = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "model": args.model,
        "longest_trained_tokens": longest,
        f"ratio_at_{n}": round(best["tokens_per_s"] / base["tokens_per_s"], 3) if base and best else None,
    }
    rows.append(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "long_context.json").write_text(json.dumps(rows, indent=1))
    print(
        "\n| run | tokens | status | step s | tokens/s | peak GiB | checkpointed layers |"
        "\n|---|---|---|---|---|---|---|"
    )
    for r in rows:
        if "tokens" in r:
            print(
                f"| {r['run']} | {r['tokens']:,} | {r['status']} | {r.get('step_s', '')} "
                f"| {r.get('tokens_per_s', '')} | {r['peak_gib']} | {r.get('checkpointed', '')} |"
            )
    print(json.dumps(sync_row))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

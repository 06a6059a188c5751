"""TrainingRun: one agentic PPO training of a kernel-writing policy against a SandboxPool.

Defaults are the CUDA Agent paper's recipe (150 PPO steps of 1024 episodes, clip-higher 0.2/0.28, actor
lr 3e-6, critic lr 6e-6, gamma 1, lambda 0.95, 150-turn episodes in a 128k context after a three-stage
warm-up, milestone reward with a 5% margin), so a spec needs to name only its model, data and pool.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictBool, StrictFloat, StrictInt

from cuda_agent.api.base import (
    DNS_SUBDOMAIN,
    MAX_LIST,
    MAX_NAME,
    MAX_URI,
    ApiModel,
    CelRule,
    Condition,
    CustomResource,
    PrinterColumn,
    conditions_field,
    immutable,
    object_name_rule,
    section,
    storage_uri,
)
from cuda_agent.api.sandbox import ToolName

# Children are named <name>-ray-head (pod hostname, Service), <name>-head-svc (KubeRay), <name>-driver...;
# the longest that must be a DNS label is "-ray-head" (9 characters) after the name.
MAX_RUN_NAME = 63 - len("-ray-head")


class TrainingRunPhase(StrEnum):
    """Coarse lifecycle position, for `kubectl get`; conditions carry the details."""

    PENDING = "Pending"
    QUEUED = "Queued"  # waiting for its whole gang of GPUs (or for Kueue's admission)
    WARMING_UP = "WarmingUp"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class TrainingRunConditionType(StrEnum):
    """The condition types the operator writes on a TrainingRun."""

    ADMITTED = "Admitted"  # the run's whole gang of GPUs fits (or Kueue admitted it)
    PROVISIONING = "Provisioning"
    WARMING_UP = "WarmingUp"
    TRAINING = "Training"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


# The tool names are the sandbox contract's (cuda_agent.api.sandbox, pydantic only): one home for the list
# the server routes, the client calls and a TrainingRun may offer.
AgentTool = ToolName


class RewardScheme(StrEnum):
    MILESTONE = "milestone"


class PrecisionPolicy(StrEnum):
    """Float32 matmul precision used for both the baseline and the candidate. TF32 alone makes an fp32
    matmul ~7x faster on an H200, so timing one side with it and not the other is not a comparison."""

    STRICT_FP32 = "strict-fp32"
    TF32 = "tf32"


class ModelSource(ApiModel):
    """Where the policy (and optionally the critic) start from."""

    base: Annotated[
        str,
        Field(
            max_length=MAX_URI,
            description="Base policy weights: s3://bucket/key, pvc://claim/path or an "
            "absolute path to a Hugging Face format checkpoint directory.",
        ),
        storage_uri("spec.model.base", ("s3", "pvc", "path")),
    ]
    critic: (
        Annotated[
            str,
            Field(max_length=MAX_URI),
            storage_uri("spec.model.critic", ("s3", "pvc", "path")),
        ]
        | None
    ) = Field(
        default=None,
        description="Initial critic weights (same URI forms as base). When absent the critic starts from "
        "the base model with a fresh value head and value pretraining fits it.",
    )
    random_init: StrictBool = Field(
        default=False,
        description="Build the policy from base's config.json with random weights instead of loading its "
        "weights (tests and benchmarks; nothing is downloaded).",
    )
    gguf_file: str | None = Field(
        default=None,
        max_length=MAX_NAME,
        # A file name, never a path: it is joined to base, so a '/' or '..' could leave it.
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*\.gguf$",
        description="Name of a GGUF file inside base to load (dequantised) instead of safetensors weights, "
        "e.g. the offline SmolLM2 package's file.",
    )


class DatasetSource(ApiModel):
    """Task sets in KernelBench format (one PyTorch reference model per task)."""

    uri: Annotated[
        str,
        Field(
            max_length=MAX_URI,
            description="Training tasks: s3://bucket/key, pvc://claim/path or an absolute path.",
        ),
        storage_uri("spec.dataset.uri", ("s3", "pvc", "path")),
    ]
    eval_uri: (
        Annotated[str, Field(max_length=MAX_URI), storage_uri("spec.dataset.evalUri", ("s3", "pvc", "path"))]
        | None
    ) = Field(default=None, description="Held-out tasks evaluated at every checkpoint; none when absent.")


class SandboxPoolRef(ApiModel):
    """A SandboxPool in the TrainingRun's namespace."""

    name: str = Field(max_length=MAX_NAME, pattern=DNS_SUBDOMAIN, description="Name of the SandboxPool.")


class PpoAlgorithm(ApiModel):
    """PPO with GAE and asymmetric (clip-higher) ratio clipping."""

    cel_rules = (
        CelRule(
            "self.clipLow <= self.clipHigh",
            "spec.algorithm.clipLow must be less than or equal to spec.algorithm.clipHigh",
            field_path=".clipLow",
            check=lambda a: a.clip_low <= a.clip_high,
        ),
    )

    name: Literal["ppo"] = Field(default="ppo", description="Policy-optimisation algorithm; only ppo.")
    steps: StrictInt = Field(
        default=150, ge=1, le=1_000_000, description="PPO steps (policy updates) to run."
    )
    batch_size: StrictInt = Field(
        default=1024, ge=1, le=65_536, description="Episodes collected per PPO step."
    )
    clip_low: StrictFloat = Field(
        default=0.2, gt=0, le=1, description="Lower clip range: the ratio is clipped below at 1 - clipLow."
    )
    clip_high: StrictFloat = Field(
        default=0.28,
        gt=0,
        le=1,
        description="Upper clip range: the ratio is clipped above at 1 + clipHigh. Larger than clipLow so "
        "rare good actions can gain probability faster (clip-higher).",
    )
    actor_learning_rate: StrictFloat = Field(
        default=3e-6, gt=0, le=1, description="Actor (policy) learning rate."
    )
    critic_learning_rate: StrictFloat = Field(
        default=6e-6, gt=0, le=1, description="Critic (value) learning rate."
    )
    gamma: StrictFloat = Field(
        default=1.0, ge=0, le=1, description="Discount factor; 1 because the reward is terminal."
    )
    gae_lambda: StrictFloat = Field(default=0.95, ge=0, le=1, description="GAE lambda.")
    kl_coef: StrictFloat = Field(
        default=0.0,
        ge=0,
        le=10,
        description="Weight of the KL penalty to the reference policy; 0 turns it off.",
    )


def _unique_tools(tools: list[AgentTool]) -> list[AgentTool]:
    # Mirrors the apiserver's x-kubernetes-list-type: set check for local runs.
    duplicates = sorted({t.value for t in tools if tools.count(t) > 1})
    if duplicates:
        raise ValueError(f"spec.agent.tools lists {', '.join(duplicates)} more than once")
    return tools


class AgentSpec(ApiModel):
    """The multi-turn agent loop: how long an episode may run and what it may do."""

    max_turns_train: StrictInt = Field(
        default=150, ge=1, le=1000, description="Turn limit of a training episode."
    )
    max_turns_eval: StrictInt = Field(
        default=200, ge=1, le=1000, description="Turn limit of an evaluation episode."
    )
    max_context_tokens: StrictInt = Field(
        default=131_072,
        ge=1024,
        le=1_048_576,
        description="Context budget of an episode, prompt and tool output included.",
    )
    tools: Annotated[list[AgentTool], AfterValidator(_unique_tools)] = Field(
        default=list(AgentTool),
        min_length=1,
        max_length=MAX_LIST,
        description="Tools offered to the agent.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class SingleTurnPpoWarmup(ApiModel):
    """Stage 1: single-turn PPO at a short context, so the policy learns to emit compilable kernels before
    long multi-turn episodes."""

    enabled: StrictBool = Field(default=True, description="Run this stage.")
    steps: StrictInt = Field(default=50, ge=1, le=100_000, description="PPO steps of the stage.")
    max_context_tokens: StrictInt = Field(
        default=32_768, ge=1024, le=1_048_576, description="Context budget of the stage."
    )


class RftWarmup(ApiModel):
    """Stage 2: rejection fine-tuning of the actor on multi-turn trajectories that reached a reward."""

    enabled: StrictBool = Field(default=True, description="Run this stage.")
    min_reward: StrictInt = Field(
        default=1,
        ge=-1,
        le=3,
        description="Keep trajectories whose milestone reward is at least this (1 = correct).",
    )
    epochs: StrictInt = Field(default=3, ge=1, le=1000, description="Passes over the kept trajectories.")
    learning_rate: StrictFloat = Field(
        default=1e-5,
        gt=0,
        le=1,
        description="Actor learning rate of this stage (supervised fine-tuning, not the PPO rate; verl's "
        "SFT trainer default).",
    )
    mini_batch_episodes: StrictInt = Field(
        default=16,
        ge=1,
        le=65_536,
        description="Kept trajectories per optimizer step: each epoch takes ceil(kept / this) steps.",
    )
    trajectories_uri: (
        Annotated[
            str,
            Field(max_length=MAX_URI),
            storage_uri("spec.warmup.rft.trajectoriesUri", ("s3", "pvc", "path")),
        ]
        | None
    ) = Field(
        default=None,
        description="JSON lines of trajectories (demonstrations or earlier rollouts) to filter and fine-tune "
        "on; when absent the stage collects one batch of rollouts with the base policy.",
    )
    max_repeated_turns: StrictInt = Field(
        default=2,
        ge=1,
        le=1000,
        description="Drop a trajectory in which one generated turn (the same tokens) occurs more than this "
        "many times: a redundant loop.",
    )


class ValuePretrainingWarmup(ApiModel):
    """Stage 3: fit the critic on warm-up trajectories with the actor frozen, so early PPO advantages are
    not noise from an untrained value head."""

    enabled: StrictBool = Field(default=True, description="Run this stage.")
    max_epochs: StrictInt = Field(
        default=20,
        ge=1,
        le=10_000,
        description="Passes over the warm-up trajectories at most; the stage ends earlier when explained "
        "variance stops improving.",
    )
    patience: StrictInt = Field(
        default=2,
        ge=1,
        le=1000,
        description="Stop after this many passes in a row that neither raise explained variance by "
        "minImprovement nor lower the mean squared value error by that fraction.",
    )
    min_improvement: StrictFloat = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Smallest rise of explained variance (or relative fall of the value error) that counts.",
    )
    mini_batch_episodes: StrictInt = Field(
        default=16, ge=1, le=65_536, description="Trajectories per critic optimizer step."
    )
    learning_rate: StrictFloat | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Critic learning rate of this stage; spec.algorithm.criticLearningRate when absent.",
    )


class WarmupSpec(ApiModel):
    """Warm-up stages, run in order before multi-turn PPO; each can be turned off."""

    single_turn_ppo: SingleTurnPpoWarmup = section(SingleTurnPpoWarmup, "Stage 1: single-turn PPO.")
    rft: RftWarmup = section(RftWarmup, "Stage 2: rejection fine-tuning of the actor.")
    value_pretraining: ValuePretrainingWarmup = section(
        ValuePretrainingWarmup, "Stage 3: critic pretraining."
    )


class Tolerance(ApiModel):
    """Correctness check: |candidate - reference| <= atol + rtol * |reference|, element-wise."""

    atol: StrictFloat = Field(default=1e-2, ge=0, le=1, description="Absolute tolerance.")
    rtol: StrictFloat = Field(default=1e-2, ge=0, le=1, description="Relative tolerance.")


class RewardSpec(ApiModel):
    """How the judge turns a candidate kernel into a reward."""

    scheme: RewardScheme = Field(
        default=RewardScheme.MILESTONE,
        description="milestone: -1 fails to build or verify, 1 correct, 2 faster than eager, 3 faster than "
        "both eager and torch.compile by more than speedupMargin.",
    )
    speedup_margin: StrictFloat = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Fraction by which a candidate must beat a baseline to count as faster.",
    )
    tolerance: Tolerance = section(Tolerance, "Numerical tolerance of the correctness check.")
    precision: PrecisionPolicy = Field(
        default=PrecisionPolicy.STRICT_FP32, description="Float32 precision of baseline and candidate alike."
    )


class ResourcesSpec(ApiModel):
    """GPUs of the training job and how models are split across them."""

    cel_rules = (
        CelRule(
            "self.trainerGpus % self.sequenceParallelSize == 0",
            "spec.resources.trainerGpus must be a multiple of spec.resources.sequenceParallelSize",
            field_path=".sequenceParallelSize",
            check=lambda r: r.trainer_gpus % r.sequence_parallel_size == 0,
        ),
        CelRule(
            "(self.rolloutGpus == 0 ? self.trainerGpus : self.rolloutGpus) % self.tensorParallelSize == 0",
            "spec.resources.rolloutGpus (trainerGpus when 0) must be a multiple of "
            "spec.resources.tensorParallelSize",
            field_path=".tensorParallelSize",
            check=lambda r: (r.rollout_gpus or r.trainer_gpus) % r.tensor_parallel_size == 0,
        ),
        CelRule(
            "self.tensorParallelSize <= 8",
            "spec.resources.tensorParallelSize must be at most 8: a rollout engine runs inside one Ray "
            "worker pod, and those hold at most 8 GPUs",
            field_path=".tensorParallelSize",
            check=lambda r: r.tensor_parallel_size <= 8,
        ),
    )

    trainer_gpus: StrictInt = Field(
        default=8, ge=1, le=4096, description="GPUs of the actor/critic/reference workers."
    )
    rollout_gpus: StrictInt = Field(
        default=8,
        ge=0,
        le=4096,
        description="GPUs of the vLLM rollout engines; 0 colocates them on the trainer GPUs.",
    )
    tensor_parallel_size: StrictInt = Field(
        default=1, ge=1, le=64, description="Tensor-parallel size of a rollout engine."
    )
    sequence_parallel_size: StrictInt = Field(
        default=1, ge=1, le=64, description="Ulysses sequence-parallel size of training (long contexts)."
    )


class CheckpointSpec(ApiModel):
    """When and where actor/critic checkpoints are written."""

    every_steps: StrictInt = Field(
        default=10, ge=1, le=1_000_000, description="Write a checkpoint every this many PPO steps."
    )
    prefix: (
        Annotated[str, Field(max_length=MAX_URI), storage_uri("spec.checkpoint.prefix", ("s3",))] | None
    ) = Field(
        default=None,
        description="s3:// prefix of the checkpoints; the operator's artifact bucket/<namespace>/<name> "
        "when absent. S3 because every trainer worker and the operator must reach it.",
    )
    keep: StrictInt = Field(
        default=3, ge=1, le=1000, description="Most recent checkpoints kept; older ones are deleted."
    )


class TrainerSpec(ApiModel):
    """How the learner runs: engine, memory and precision knobs that do not change the algorithm."""

    cel_rules = (
        CelRule(
            "!has(self.checkpointedLayers) || self.activationCheckpointing",
            "spec.trainer.checkpointedLayers needs spec.trainer.activationCheckpointing: true (without it no "
            "layer recomputes its activations)",
            field_path=".checkpointedLayers",
            check=lambda t: t.checkpointed_layers is None or t.activation_checkpointing,
        ),
    )

    engine: Literal["deepspeed", "torch"] = Field(
        default="deepspeed",
        description="deepspeed (ZeRO, data parallel over trainer GPUs) or torch (one device, plain AdamW).",
    )
    zero_stage: StrictInt = Field(
        default=3,
        ge=0,
        le=3,
        description="DeepSpeed ZeRO stage of actor and critic (0 = plain data parallel).",
    )
    precision: Literal["bf16", "fp32"] = Field(
        default="bf16",
        description="Parameter/activation dtype of actor, critic and reference; log-probs, ratios and "
        "values are always computed in fp32.",
    )
    micro_batch_tokens: StrictInt = Field(
        default=65_536,
        ge=16,
        le=4_194_304,
        description="Token budget of one micro-batch (padded tokens counted); longer episodes get a "
        "micro-batch of their own.",
    )
    logits_chunk_tokens: StrictInt = Field(
        default=8192,
        ge=16,
        le=1_048_576,
        description="Tokens per checkpointed chunk when log-probs, entropy and values are computed from "
        "hidden states; the [tokens x vocab] logits never exist for more than one chunk.",
    )
    activation_checkpointing: StrictBool = Field(
        default=True, description="Recompute decoder-layer activations in the backward pass."
    )
    checkpointed_layers: StrictInt | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="How many decoder layers (the first N) recompute their activations in the backward "
        "pass; 0 = none, more than the model has = all. Absent: chosen before each training micro-batch "
        "from its tokens, the model's activation bytes per token and layer, and the GPU's free memory "
        "(the fewest that fit; all on CPU). Only with activationCheckpointing.",
    )
    save_attention_outputs: StrictBool = Field(
        default=True,
        description="Selective activation checkpointing: keep each layer's attention output (O(tokens) "
        "memory) so the backward pass recomputes everything but the quadratic attention.",
    )
    attention_backend: Literal["auto", "flash", "cudnn"] = Field(
        default="auto",
        description="Scaled-dot-product attention kernel on GPUs: auto (PyTorch's choice), flash "
        "(FlashAttention-2) or cudnn (cuDNN's fused attention, with grouped key/value heads expanded so "
        "it is eligible).",
    )
    ppo_epochs: StrictInt = Field(default=1, ge=1, le=100, description="Passes over each rollout batch.")
    mini_batches: StrictInt = Field(
        default=4,
        ge=1,
        le=1024,
        description="Optimizer steps per pass over a rollout batch. Every step after the first sees a "
        "policy that already moved, so the clip range binds (verl: mini-batch 256 of a 1024 batch); 1 "
        "makes every update on-policy and the clip inert.",
    )
    lr_warmup_steps: StrictInt = Field(
        default=0, ge=0, le=1_000_000, description="Optimizer steps of linear learning-rate warm-up."
    )
    value_clip: StrictFloat = Field(
        default=0.2, gt=0, le=100, description="Values move at most this far from the rollout's values."
    )
    max_grad_norm: StrictFloat = Field(default=1.0, gt=0, le=1e6, description="Gradient-norm clip.")
    weight_sync_bucket_mb: StrictInt = Field(
        default=512,
        ge=1,
        le=65_536,
        description="Size of one bucket of actor weights sent to the rollout engines.",
    )
    seed: StrictInt = Field(
        default=0, ge=0, le=2**31 - 1, description="Seed of data order and initialisation."
    )
    use_ray: StrictBool = Field(
        default=True,
        description="Run actor, critic, reference and rollout as Ray actor groups with placement groups; "
        "false runs every role in the trainer process (CPU demos, tests).",
    )


class RunPolicySpec(ApiModel):
    """When a run gives up: its deadline, how often its trainer may crash, how long its start may take.
    Each ends the run as Failed with a reason that names the limit."""

    cel_rules = (
        CelRule(
            "!has(self.activeDeadlineSeconds) || self.activeDeadlineSeconds > self.startTimeoutSeconds",
            "spec.runPolicy.activeDeadlineSeconds must be greater than spec.runPolicy.startTimeoutSeconds",
            field_path=".activeDeadlineSeconds",
            check=lambda p: (
                p.active_deadline_seconds is None or p.active_deadline_seconds > p.start_timeout_seconds
            ),
        ),
    )

    active_deadline_seconds: StrictInt | None = Field(
        default=None,
        ge=1,
        le=31_536_000,
        description="Longest time a run may hold its GPUs, counted from status.startTime (its admission; "
        "restarted on resume); then it is Failed with reason DeadlineExceeded. No limit when absent.",
    )
    backoff_limit: StrictInt = Field(
        default=3,
        ge=0,
        le=100,
        description="Trainer (driver) restarts after a crash before the run is Failed with reason "
        "BackoffLimitExceeded; the trainer resumes from status.lastCheckpoint after each.",
    )
    start_timeout_seconds: StrictInt = Field(
        default=900,
        ge=1,
        le=86_400,
        description="Longest time from admission until the Ray cluster is ready and the trainer runs "
        "(pulling images, scheduling pods); then the run is Failed with reason StartTimeout.",
    )


class TrainingRunSpec(ApiModel):
    """Desired state of a TrainingRun."""

    cel_rules = (
        CelRule(
            "self.checkpoint.everySteps <= self.algorithm.steps",
            "spec.checkpoint.everySteps must be at most spec.algorithm.steps, or no checkpoint is written",
            field_path=".checkpoint.everySteps",
            check=lambda s: s.checkpoint.every_steps <= s.algorithm.steps,
        ),
        CelRule(
            "self.warmup.singleTurnPpo.maxContextTokens <= self.agent.maxContextTokens",
            "spec.warmup.singleTurnPpo.maxContextTokens must be at most spec.agent.maxContextTokens",
            field_path=".warmup.singleTurnPpo.maxContextTokens",
            check=lambda s: s.warmup.single_turn_ppo.max_context_tokens <= s.agent.max_context_tokens,
        ),
    )

    model: Annotated[
        ModelSource,
        immutable("spec.model", "a run cannot switch weights mid-training; create a new TrainingRun"),
    ] = Field(description="Policy and critic initial weights.")
    dataset: DatasetSource = Field(description="Training (and optional evaluation) task sets.")
    sandbox_pool_ref: SandboxPoolRef = Field(
        description="The SandboxPool that builds, verifies and times kernels."
    )
    algorithm: PpoAlgorithm = section(PpoAlgorithm, "Policy-optimisation hyperparameters.")
    agent: AgentSpec = section(AgentSpec, "Agent loop limits and tools.")
    warmup: WarmupSpec = section(WarmupSpec, "Warm-up stages before multi-turn PPO.")
    reward: Annotated[
        RewardSpec,
        immutable(
            "spec.reward", "rewards before and after a change would not be comparable; create a new run"
        ),
    ] = section(RewardSpec, "Reward scheme, tolerance and precision policy.")
    resources: ResourcesSpec = section(ResourcesSpec, "GPUs and parallelism.")
    checkpoint: CheckpointSpec = section(CheckpointSpec, "Checkpoint cadence and location.")
    trainer: TrainerSpec = section(TrainerSpec, "Learner engine, memory and precision settings.")
    run_policy: RunPolicySpec = section(RunPolicySpec, "Deadline, trainer restarts and start timeout.")
    suspend: StrictBool = Field(
        default=False, description="Stop the run's pods, keeping its last checkpoint; false resumes from it."
    )


class TrainingMetrics(ApiModel):
    """Rollout metrics of the most recent step."""

    mean_reward: StrictFloat | None = Field(
        default=None, ge=-1, le=3, description="Mean milestone reward of the batch."
    )
    pass_rate: StrictFloat | None = Field(
        default=None, ge=0, le=1, description="Fraction of episodes with a correct kernel."
    )
    faster_than_compile_rate: StrictFloat | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Fraction of episodes whose kernel beat torch.compile by the margin.",
    )
    clip_fraction: StrictFloat | None = Field(
        default=None, ge=0, le=1, description="Share of policy tokens whose ratio the PPO clip bound."
    )
    approx_kl: StrictFloat | None = Field(
        default=None, description="Mean log-ratio of the policy before and after the step's updates."
    )
    entropy: StrictFloat | None = Field(
        default=None, ge=0, description="Mean per-token entropy of the policy on the batch."
    )
    explained_variance: StrictFloat | None = Field(
        default=None, le=1, description="How much of the returns' variance the critic's values explain."
    )


class TrainingRunStatus(ApiModel):
    """Observed state of a TrainingRun, written by the operator."""

    observed_generation: StrictInt | None = Field(
        default=None, ge=0, description="metadata.generation last acted upon."
    )
    phase: TrainingRunPhase | None = Field(default=None, description="Coarse lifecycle position.")
    conditions: list[Condition] = conditions_field()
    start_time: datetime | None = Field(
        default=None,
        description="When the run was admitted and its compute started; runPolicy deadlines count from "
        "it. Cleared while the run is queued or suspended.",
    )
    step: StrictInt | None = Field(default=None, ge=0, description="PPO steps completed.")
    metrics: TrainingMetrics | None = Field(default=None, description="Metrics of the most recent step.")
    last_checkpoint: str | None = Field(
        default=None, max_length=MAX_URI, description="URI of the newest checkpoint."
    )
    rollout: str | None = Field(
        default=None,
        max_length=256,
        description="The rollout backend and where it runs, as the trainer reports it (e.g. transformers "
        "in process on cuda (bf16)).",
    )


class TrainingRun(CustomResource):
    """An agentic PPO training of a CUDA-kernel-writing policy, with its rollouts judged by a SandboxPool."""

    cel_rules = (
        object_name_rule(
            "TrainingRun",
            MAX_RUN_NAME,
            "the Ray head pod's hostname and Service are <name>-ray-head (KubeRay's <name>-head-svc), "
            "which must fit a DNS label's 63",
        ),
    )
    plural = "trainingruns"
    singular = "trainingrun"
    short_names = ("tr",)
    printer_columns = (
        PrinterColumn("Phase", ".status.phase", "string", "Lifecycle phase."),
        PrinterColumn("Step", ".status.step", "integer", "PPO steps completed."),
        PrinterColumn("Reward", ".status.metrics.meanReward", "number", "Mean reward of the last step."),
        PrinterColumn("Pass Rate", ".status.metrics.passRate", "number", "Pass rate of the last step."),
        PrinterColumn("Age", ".metadata.creationTimestamp", "date", "Time since creation."),
        PrinterColumn("Model", ".spec.model.base", "string", "Base policy weights.", priority=1),
        PrinterColumn("Pool", ".spec.sandboxPoolRef.name", "string", "SandboxPool used.", priority=1),
    )

    api_version: Literal["cuda-agent.io/v1alpha1"] = Field(
        default="cuda-agent.io/v1alpha1", description="API version."
    )
    kind: Literal["TrainingRun"] = Field(default="TrainingRun", description="Kind of the object.")
    spec: TrainingRunSpec = Field(description="Desired state.")
    status: TrainingRunStatus | None = Field(
        default=None, description="Observed state, written by the operator."
    )

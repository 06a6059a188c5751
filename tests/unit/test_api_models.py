"""The API models: paper defaults, wire format round trips, and the Python side of every validation rule.

The same rules run at admission as CEL (tests/cluster/test_admission.py checks them on a real apiserver);
here they run through `load_resource`, which local runs use instead of an apiserver.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from cuda_agent.api import (
    AgentTool,
    PrecisionPolicy,
    ResourceError,
    SandboxPool,
    SeccompProfileType,
    TrainingRun,
    TrainingRunSpec,
    load_resource,
    load_resource_file,
    load_resources,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

MINIMAL_RUN: dict[str, Any] = {
    "apiVersion": "cuda-agent.io/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "r"},
    "spec": {
        "model": {"base": "s3://models/qwen"},
        "dataset": {"uri": "/data/ops-6k"},
        "sandboxPoolRef": {"name": "pool"},
    },
}
MINIMAL_POOL: dict[str, Any] = {
    "apiVersion": "cuda-agent.io/v1alpha1",
    "kind": "SandboxPool",
    "metadata": {"name": "pool"},
    "spec": {"image": "cuda-agent-sandbox:0.1.0"},
}


def with_field(document: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of `document` with the field at `dotted` (e.g. "spec.algorithm.clipLow") set."""
    result = copy.deepcopy(document)
    *parents, leaf = dotted.split(".")
    node = result
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return result


def rejection(document: dict[str, Any]) -> str:
    with pytest.raises(ResourceError) as caught:
        load_resource(document)
    return str(caught.value)


def test_training_run_defaults_are_the_papers_recipe() -> None:
    spec = load_resource(MINIMAL_RUN, TrainingRun).spec
    algorithm = spec.algorithm
    assert (algorithm.name, algorithm.steps, algorithm.batch_size) == ("ppo", 150, 1024)
    assert (algorithm.clip_low, algorithm.clip_high) == (0.2, 0.28)
    assert (algorithm.actor_learning_rate, algorithm.critic_learning_rate) == (3e-6, 6e-6)
    assert (algorithm.gamma, algorithm.gae_lambda) == (1.0, 0.95)
    assert (spec.agent.max_turns_train, spec.agent.max_turns_eval) == (150, 200)
    assert spec.agent.max_context_tokens == 131_072
    assert set(spec.agent.tools) == set(AgentTool)
    assert spec.warmup.single_turn_ppo.enabled and spec.warmup.single_turn_ppo.max_context_tokens == 32_768
    assert spec.warmup.rft.enabled and spec.warmup.value_pretraining.enabled
    assert spec.reward.scheme == "milestone" and spec.reward.speedup_margin == 0.05
    assert (spec.reward.tolerance.atol, spec.reward.tolerance.rtol) == (1e-2, 1e-2)
    assert spec.reward.precision is PrecisionPolicy.STRICT_FP32
    assert spec.suspend is False and spec.model.critic is None and spec.checkpoint.prefix is None


def test_sandbox_pool_defaults() -> None:
    spec = load_resource(MINIMAL_POOL, SandboxPool).spec
    assert spec.replicas == 1 and spec.autoscaling is None
    assert (spec.gpu.resource_name, spec.gpu.count, spec.gpu.product) == ("nvidia.com/gpu", 1, None)
    assert spec.security.seccomp_profile.type is SeccompProfileType.RUNTIME_DEFAULT
    assert spec.security.runtime_class_name is None
    assert spec.limits.memory == "32Gi" and spec.limits.pids == 1024


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load_and_round_trip(path: Path) -> None:
    for resource in load_resource_file(path):
        manifest = resource.to_manifest()
        assert type(resource).model_validate(manifest) == resource
        # The wire format is camelCase all the way down.
        assert "sandboxPoolRef" in manifest["spec"] or "replicas" in manifest["spec"]


def test_full_example_spells_out_exactly_the_defaults() -> None:
    written = load_resource_file(REPO / "examples" / "trainingrun.yaml")[0]
    assert isinstance(written, TrainingRun)
    minimal = TrainingRunSpec.model_validate(
        {
            "model": written.spec.model,
            "dataset": written.spec.dataset,
            "sandboxPoolRef": written.spec.sandbox_pool_ref,
        }
    )
    explicit = written.spec.model_copy(update={"checkpoint": minimal.checkpoint})
    assert explicit == minimal


def test_snake_case_names_populate_and_dump_as_camel_case() -> None:
    spec = TrainingRunSpec.model_validate(
        {
            "model": {"base": "/models/q"},
            "dataset": {"uri": "/data"},
            "sandbox_pool_ref": {"name": "pool"},
            "algorithm": {"clip_high": 0.3},
        }
    )
    dumped = spec.model_dump(by_alias=True)
    assert dumped["algorithm"]["clipHigh"] == 0.3 and dumped["sandboxPoolRef"] == {"name": "pool"}
    assert "clip_high" not in dumped["algorithm"]


def test_to_manifest_leaves_out_unset_optional_fields() -> None:
    manifest = load_resource(MINIMAL_RUN).to_manifest()
    assert list(manifest)[:3] == ["apiVersion", "kind", "metadata"]
    assert manifest["metadata"] == {"name": "r"}
    assert "status" not in manifest and "critic" not in manifest["spec"]["model"]


def test_status_with_conditions_round_trips() -> None:
    document = with_field(
        MINIMAL_RUN,
        "status",
        {
            "observedGeneration": 3,
            "phase": "Running",
            "step": 12,
            "metrics": {"meanReward": 1.5, "passRate": 0.8, "fasterThanCompileRate": 0.25},
            "lastCheckpoint": "s3://ckpt/r/step-10",
            "conditions": [
                {
                    "type": "Progressing",
                    "status": "True",
                    "reason": "Training",
                    "message": "step 12 of 150",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                    "observedGeneration": 3,
                }
            ],
        },
    )
    run = load_resource(document, TrainingRun)
    assert run.status is not None and run.status.conditions[0].reason == "Training"
    assert run.to_manifest()["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"


BAD_SPECS = [
    ("spec.algorithm.clipLow", 0, "spec.algorithm.clipLow"),
    ("spec.algorithm.clipLow", 0.5, "clipLow must be less than or equal to spec.algorithm.clipHigh"),
    ("spec.algorithm.steps", -5, "spec.algorithm.steps"),
    ("spec.algorithm.name", "grpo", "spec.algorithm.name"),
    ("spec.algorithm.batchSize", "many", "spec.algorithm.batchSize"),
    ("spec.model.base", "http://example.com/m", "spec.model.base must be s3://bucket/key"),
    ("spec.model.base", "relative/path", "spec.model.base must be"),
    ("spec.model.base", "pvc://claim/../etc", "spec.model.base must be"),
    ("spec.model.base", "/models/q\n", "spec.model.base must be"),
    ("spec.model.critic", "hf://org/model", "spec.model.critic must be"),
    ("spec.dataset.uri", "s3://B/upper-case-bucket", "spec.dataset.uri must be"),
    ("spec.checkpoint.prefix", "/local/dir", "spec.checkpoint.prefix must be s3://bucket/key"),
    ("spec.checkpoint.everySteps", 500, "spec.checkpoint.everySteps must be at most spec.algorithm.steps"),
    ("spec.reward.precision", "fp16", "spec.reward.precision"),
    ("spec.agent.tools", ["bash", "bash"], "spec.agent.tools lists bash more than once"),
    ("spec.agent.tools", ["browser"], "spec.agent.tools[0]"),
    ("spec.warmup.singleTurnPpo.maxContextTokens", 262_144, "must be at most spec.agent.maxContextTokens"),
    ("spec.resources.sequenceParallelSize", 3, "trainerGpus must be a multiple of"),
    ("spec.resources.tensorParallelSize", 3, "must be a multiple of spec.resources.tensorParallelSize"),
    ("spec.sandboxPoolRef.name", "Not_A_Name", "spec.sandboxPoolRef.name"),
    ("spec.algorithm.bogus", 1, "spec.algorithm.bogus: Extra inputs are not permitted"),
]


@pytest.mark.parametrize(
    ("field", "value", "expected"), BAD_SPECS, ids=[f"{f}={v!r}" for f, v, _ in BAD_SPECS]
)
def test_bad_training_runs_are_rejected_naming_the_field(field: str, value: Any, expected: str) -> None:
    assert expected in rejection(with_field(MINIMAL_RUN, field, value))


BAD_POOLS = [
    ("spec.replicas", -1, "spec.replicas"),
    ("spec.autoscaling", {"minReplicas": 5, "maxReplicas": 2}, "minReplicas must be less than or equal to"),
    ("spec.autoscaling", {"minReplicas": 2, "maxReplicas": 4}, "spec.replicas must lie within"),
    ("spec.gpu.resourceName", "gpu", "spec.gpu.resourceName"),
    (
        "spec.security.seccompProfile",
        {"type": "Localhost"},
        "localhostProfile is required when type is Localhost",
    ),
    (
        "spec.security.seccompProfile",
        {"localhostProfile": "p.json"},
        "must be unset unless type is Localhost",
    ),
    ("spec.security.seccompProfile", {"type": "Localhost", "localhostProfile": "a/../b"}, "'..' segments"),
    ("spec.security.seccompProfile.type", "Unconfined", "spec.security.seccompProfile.type"),
    ("spec.limits.memory", "lots", "spec.limits.memory"),
    ("spec.image", "", "spec.image"),
]


@pytest.mark.parametrize(
    ("field", "value", "expected"), BAD_POOLS, ids=[f"{f}={v!r}" for f, v, _ in BAD_POOLS]
)
def test_bad_sandbox_pools_are_rejected_naming_the_field(field: str, value: Any, expected: str) -> None:
    assert expected in rejection(with_field(MINIMAL_POOL, field, value))


def test_errors_give_file_line_and_field_path() -> None:
    text = textwrap.dedent(
        """\
        apiVersion: cuda-agent.io/v1alpha1
        kind: TrainingRun
        metadata: {name: r}
        spec:
          model: {base: s3://models/q}
          dataset: {uri: /data}
          sandboxPoolRef: {name: pool}
          algorithm:
            steps: 0
        """
    )
    with pytest.raises(ResourceError) as caught:
        load_resource(text, source_name="run.yaml")
    assert str(caught.value).startswith(
        "run.yaml:9: spec.algorithm.steps: Input should be greater than or equal to 1"
    )
    assert caught.value.problems[0].path == "spec.algorithm.steps"


def test_every_problem_is_reported_not_only_the_first() -> None:
    document = with_field(with_field(MINIMAL_RUN, "spec.algorithm.steps", 0), "spec.agent.maxTurnsEval", 0)
    with pytest.raises(ResourceError) as caught:
        load_resource(document)
    assert {p.path for p in caught.value.problems} == {"spec.algorithm.steps", "spec.agent.maxTurnsEval"}


def test_wrong_kind_api_version_and_yaml_are_named() -> None:
    assert "apiVersion: expected 'cuda-agent.io/v1alpha1', got 'v1'" in rejection(
        {**MINIMAL_RUN, "apiVersion": "v1"}
    )
    assert "kind: expected SandboxPool or TrainingRun, got 'Pod'" in rejection({**MINIMAL_RUN, "kind": "Pod"})
    with pytest.raises(ResourceError, match="kind: expected SandboxPool, got 'TrainingRun'"):
        load_resource(MINIMAL_RUN, SandboxPool)
    with pytest.raises(ResourceError, match=r"^cfg.yaml:2: invalid YAML: mapping values are not allowed"):
        load_resource("a: 1\nb: x: y\nc: 2\n", source_name="cfg.yaml")
    with pytest.raises(ResourceError, match="expected one YAML document, found 2"):
        load_resource(yaml.safe_dump_all([MINIMAL_RUN, MINIMAL_POOL]))


def test_multi_document_streams_load_every_object() -> None:
    resources = load_resources(yaml.safe_dump_all([MINIMAL_POOL, None, MINIMAL_RUN]))
    assert [type(r) for r in resources] == [SandboxPool, TrainingRun]


def test_importing_the_api_and_cli_does_not_import_torch() -> None:
    """The operator image has no torch: the API and the CLI dispatcher must not pull it in."""
    code = "import sys, cuda_agent.api, cuda_agent.api.crdgen, cuda_agent.cli; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"

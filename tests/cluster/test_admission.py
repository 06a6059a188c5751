"""Admission of TrainingRun / SandboxPool objects by a real kube-apiserver running the generated CRDs.

Every example is accepted, the apiserver fills the same defaults as the pydantic models, and each
malformed object in the table below is rejected with a message naming the offending field. This is where
the CEL rules are compiled, costed and evaluated for real (the unit tests only see their text).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cuda_agent.api import ResourceError, load_resource

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

RUN: dict[str, Any] = {
    "apiVersion": "cuda-agent.io/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "run"},
    "spec": {
        "model": {"base": "s3://models/qwen3-8b"},
        "dataset": {"uri": "pvc://datasets/ops-6k"},
        "sandboxPoolRef": {"name": "pool"},
    },
}
POOL: dict[str, Any] = {
    "apiVersion": "cuda-agent.io/v1alpha1",
    "kind": "SandboxPool",
    "metadata": {"name": "pool"},
    "spec": {"image": "cuda-agent-sandbox:0.1.0"},
}


def edited(document: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A copy of `document` with dotted fields (written with "__" for ".") set; None deletes the field."""
    result = copy.deepcopy(document)
    for dotted, value in fields.items():
        *parents, leaf = dotted.split("__")
        node = result
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return result


@pytest.fixture(scope="module")
def namespace(kube_cluster: Any) -> Iterator[str]:
    name = f"admission-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def apply(kube_cluster: Any, namespace: str, document: dict[str, Any], *extra: str) -> Any:
    return kube_cluster.kubectl(
        "apply",
        "--server-side",
        "-n",
        namespace,
        "-f",
        "-",
        *extra,
        input=yaml.safe_dump(document),
        check=False,
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(kube_cluster: Any, namespace: str, path: Path) -> None:
    result = kube_cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", str(path), check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("document", [RUN, POOL], ids=["TrainingRun", "SandboxPool"])
def test_apiserver_defaults_equal_the_models_defaults(
    kube_cluster: Any, namespace: str, document: dict[str, Any]
) -> None:
    name = f"defaults-{document['kind'].lower()}"
    created = edited(document, metadata__name=name)
    assert apply(kube_cluster, namespace, created).returncode == 0
    stored = json.loads(
        kube_cluster.kubectl("get", document["kind"], name, "-n", namespace, "-o", "json").stdout
    )
    assert stored["spec"] == load_resource(created).to_manifest()["spec"]


# (id, document, fragments the rejection must contain: the field path first)
MALFORMED: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("run-steps-negative", edited(RUN, spec__algorithm={"steps": -5}), ("spec.algorithm.steps",)),
    (
        "run-steps-not-int",
        edited(RUN, spec__algorithm={"steps": "many"}),
        ("spec.algorithm.steps", "integer"),
    ),
    ("run-clip-low-zero", edited(RUN, spec__algorithm={"clipLow": 0}), ("spec.algorithm.clipLow",)),
    (
        "run-clip-low-above-high",
        edited(RUN, spec__algorithm={"clipLow": 0.3, "clipHigh": 0.25}),
        ("spec.algorithm.clipLow", "must be less than or equal to spec.algorithm.clipHigh"),
    ),
    (
        "run-clip-low-above-default-high",
        edited(RUN, spec__algorithm={"clipLow": 0.5}),
        ("spec.algorithm.clipLow", "must be less than or equal to spec.algorithm.clipHigh"),
    ),
    ("run-unknown-algorithm", edited(RUN, spec__algorithm={"name": "grpo"}), ("spec.algorithm.name", "grpo")),
    (
        "run-learning-rate-negative",
        edited(RUN, spec__algorithm={"actorLearningRate": -1e-6}),
        ("spec.algorithm.actorLearningRate",),
    ),
    (
        "run-base-http",
        edited(RUN, spec__model={"base": "http://example.com/m"}),
        ("spec.model.base", "must be s3://bucket/key"),
    ),
    (
        "run-base-relative",
        edited(RUN, spec__model={"base": "models/q"}),
        ("spec.model.base", "absolute path"),
    ),
    ("run-base-trailing-newline", edited(RUN, spec__model={"base": "/models/q\n"}), ("spec.model.base",)),
    (
        "run-base-dot-dot",
        edited(RUN, spec__model={"base": "pvc://models/../secrets"}),
        ("spec.model.base", "'..'"),
    ),
    (
        "run-critic-scheme",
        edited(RUN, spec__model={"base": "/m", "critic": "hf://org/m"}),
        ("spec.model.critic",),
    ),
    ("run-dataset-bad-bucket", edited(RUN, spec__dataset={"uri": "s3://X/upper"}), ("spec.dataset.uri",)),
    (
        "run-checkpoint-not-s3",
        edited(RUN, spec__checkpoint={"prefix": "/tmp/ckpt"}),
        ("spec.checkpoint.prefix", "s3://"),
    ),
    (
        "run-checkpoint-rarer-than-run",
        edited(RUN, spec__algorithm={"steps": 5}, spec__checkpoint={"everySteps": 10}),
        ("spec.checkpoint.everySteps", "at most spec.algorithm.steps"),
    ),
    (
        "run-precision-unknown",
        edited(RUN, spec__reward={"precision": "fp16"}),
        ("spec.reward.precision", "fp16"),
    ),
    (
        "run-margin-out-of-range",
        edited(RUN, spec__reward={"speedupMargin": 2}),
        ("spec.reward.speedupMargin",),
    ),
    (
        "run-tool-unknown",
        edited(RUN, spec__agent={"tools": ["bash", "browser"]}),
        ("spec.agent.tools[1]", "browser"),
    ),
    (
        "run-tool-duplicate",
        edited(RUN, spec__agent={"tools": ["bash", "bash"]}),
        ("spec.agent.tools[1]", "Duplicate"),
    ),
    ("run-turns-zero", edited(RUN, spec__agent={"maxTurnsTrain": 0}), ("spec.agent.maxTurnsTrain",)),
    (
        "run-warmup-context-too-long",
        edited(RUN, spec__agent={"maxContextTokens": 16384}),
        ("spec.warmup.singleTurnPpo.maxContextTokens", "at most spec.agent.maxContextTokens"),
    ),
    (
        "run-sequence-parallel-indivisible",
        edited(RUN, spec__resources={"trainerGpus": 6, "sequenceParallelSize": 4}),
        ("spec.resources.sequenceParallelSize", "multiple"),
    ),
    (
        "run-tensor-parallel-indivisible",
        edited(RUN, spec__resources={"rolloutGpus": 6, "tensorParallelSize": 4}),
        ("spec.resources.tensorParallelSize", "multiple"),
    ),
    ("run-missing-model", edited(RUN, spec__model=None), ("spec.model", "Required")),
    (
        "run-pool-ref-bad-name",
        edited(RUN, spec__sandboxPoolRef={"name": "Bad_Name"}),
        ("spec.sandboxPoolRef.name",),
    ),
    ("run-unknown-field", edited(RUN, spec__algorithm={"bogus": 1}), ("spec.algorithm.bogus",)),
    ("run-suspend-not-bool", edited(RUN, spec__suspend="yes"), ("spec.suspend", "boolean")),
    ("pool-replicas-negative", edited(POOL, spec__replicas=-1), ("spec.replicas",)),
    (
        "pool-min-above-max",
        edited(POOL, spec__replicas=3, spec__autoscaling={"minReplicas": 5, "maxReplicas": 2}),
        ("spec.autoscaling.minReplicas", "less than or equal to spec.autoscaling.maxReplicas"),
    ),
    (
        "pool-replicas-outside-autoscaling",
        edited(POOL, spec__replicas=10, spec__autoscaling={"minReplicas": 1, "maxReplicas": 4}),
        ("spec.replicas", "must lie within"),
    ),
    ("pool-resource-name-bad", edited(POOL, spec__gpu={"resourceName": "gpu"}), ("spec.gpu.resourceName",)),
    ("pool-gpu-count-too-high", edited(POOL, spec__gpu={"count": 64}), ("spec.gpu.count",)),
    (
        "pool-localhost-without-profile",
        edited(POOL, spec__security={"seccompProfile": {"type": "Localhost"}}),
        ("spec.security.seccompProfile.localhostProfile", "required when type is Localhost"),
    ),
    (
        "pool-profile-without-localhost",
        edited(POOL, spec__security={"seccompProfile": {"localhostProfile": "p.json"}}),
        ("spec.security.seccompProfile.localhostProfile", "unset unless type is Localhost"),
    ),
    (
        "pool-profile-escapes",
        edited(
            POOL, spec__security={"seccompProfile": {"type": "Localhost", "localhostProfile": "a/../../b"}}
        ),
        ("spec.security.seccompProfile.localhostProfile", "'..'"),
    ),
    (
        "pool-seccomp-unconfined",
        edited(POOL, spec__security={"seccompProfile": {"type": "Unconfined"}}),
        ("spec.security.seccompProfile.type", "Unconfined"),
    ),
    ("pool-memory-not-quantity", edited(POOL, spec__limits={"memory": "lots"}), ("spec.limits.memory",)),
    ("pool-pids-too-low", edited(POOL, spec__limits={"pids": 1}), ("spec.limits.pids",)),
    ("pool-image-missing", edited(POOL, spec__image=None), ("spec.image", "Required")),
    ("pool-image-with-space", edited(POOL, spec__image="my image"), ("spec.image",)),
    # Issue 13, admission pass: names the children need, sizes the server accepts, references, URIs.
    (
        "pool-name-not-a-dns-label",
        edited(POOL, metadata__name="pool.with.dots"),
        ("metadata.name of a SandboxPool must be a DNS label",),
    ),
    (
        "pool-name-starts-with-digit",
        edited(POOL, metadata__name="1pool"),
        ("metadata.name of a SandboxPool must be a DNS label",),
    ),
    (
        "pool-name-too-long-for-statefulset",
        edited(POOL, metadata__name="p" * 53),
        ("at most 52 characters",),
    ),
    (
        "run-name-too-long-for-ray-head",
        edited(RUN, metadata__name="r" * 55),
        ("metadata.name of a TrainingRun must be a DNS label of at most 54 characters",),
    ),
    ("run-name-with-dots", edited(RUN, metadata__name="run.v2"), ("metadata.name of a TrainingRun",)),
    (
        "pool-memory-too-small",
        edited(POOL, spec__limits={"memory": "1Gi"}),
        ("spec.limits.memory", "between 2Gi and 16Ti"),
    ),
    (
        "pool-memory-too-large",
        edited(POOL, spec__limits={"memory": "32Ti"}),
        ("spec.limits.memory", "between 2Gi and 16Ti"),
    ),
    (
        "pool-workspace-too-small",
        edited(POOL, spec__limits={"workspaceSize": "1Mi"}),
        ("spec.limits.workspaceSize", "between 64Mi and 1Ti"),
    ),
    (
        "pool-workspace-too-large",
        edited(POOL, spec__limits={"workspaceSize": "2Ti"}),
        ("spec.limits.workspaceSize", "between 64Mi and 1Ti"),
    ),
    ("pool-image-upper-case-path", edited(POOL, spec__image="registry.io/Team/img:1"), ("spec.image",)),
    ("pool-image-short-digest", edited(POOL, spec__image="img@sha256:abc"), ("spec.image",)),
    ("pool-image-bad-tag", edited(POOL, spec__image="img:-latest"), ("spec.image",)),
    ("pool-gpu-product-empty", edited(POOL, spec__gpu={"product": ""}), ("spec.gpu.product",)),
    ("pool-gpu-product-space", edited(POOL, spec__gpu={"product": "NVIDIA H200"}), ("spec.gpu.product",)),
    (
        "run-base-encoded-dot-dot",
        edited(RUN, spec__model={"base": "s3://models/a/%2e%2e/secrets"}),
        ("spec.model.base", "percent-encoded"),
    ),
    (
        "run-base-empty-segment",
        edited(RUN, spec__model={"base": "pvc://models/a//b"}),
        ("spec.model.base", "normalised"),
    ),
    ("run-base-dot-segment", edited(RUN, spec__model={"base": "/models/./q"}), ("spec.model.base",)),
    ("run-base-nul", edited(RUN, spec__model={"base": "/models/q\x00"}), ("spec.model.base",)),
    (
        "run-gguf-file-is-a-path",
        edited(RUN, spec__model={"base": "/models/smollm2", "ggufFile": "../../etc/x.gguf"}),
        ("spec.model.ggufFile",),
    ),
    (
        "run-dataset-encoded-slash",
        edited(RUN, spec__dataset={"uri": "s3://data/a%2F..%2Fb"}),
        ("spec.dataset.uri",),
    ),
    # Issue 31, item 9: contradictory specs and pydantic looser than admission.
    (
        "run-checkpointed-layers-without-checkpointing",
        edited(RUN, spec__trainer={"activationCheckpointing": False, "checkpointedLayers": 4}),
        ("spec.trainer.checkpointedLayers", "activationCheckpointing: true"),
    ),
    (
        "run-tensor-parallel-across-pods",
        edited(RUN, spec__resources={"rolloutGpus": 16, "tensorParallelSize": 16}),
        ("spec.resources.tensorParallelSize", "at most 8"),
    ),
    (
        "pool-cpu-only-with-gpu-product",
        edited(POOL, spec__gpu={"count": 0, "product": "NVIDIA-H200"}),
        ("spec.gpu.product", "unset when spec.gpu.count is 0"),
    ),
    (
        "pool-export-traces-not-bool",
        edited(POOL, spec__telemetry={"exportTraces": "yes"}),
        ("spec.telemetry.exportTraces", "boolean"),
    ),
]

# Accepted: the forms the rules above must not catch.
WELL_FORMED: list[tuple[str, dict[str, Any]]] = [
    ("pool-name-52", edited(POOL, metadata__name="p" * 52)),
    ("run-name-54", edited(RUN, metadata__name="r" * 54)),
    (
        "pool-image-registry-port-tag-digest",
        edited(
            POOL, spec__image="registry.example.com:5000/team/cuda-agent-sandbox:0.1.0@sha256:" + "a" * 64
        ),
    ),
    ("pool-image-localhost", edited(POOL, spec__image="localhost/cuda-agent-sandbox")),
    ("pool-limits-at-bounds", edited(POOL, spec__limits={"memory": "2Gi", "workspaceSize": "1Ti"})),
    ("pool-limits-decimal", edited(POOL, spec__limits={"memory": "16000000000", "workspaceSize": "64Mi"})),
    ("run-base-trailing-slash", edited(RUN, spec__model={"base": "s3://models/qwen3-8b/"})),
    ("run-checkpointed-layers", edited(RUN, spec__trainer={"checkpointedLayers": 4})),
    ("pool-cpu-only", edited(POOL, spec__gpu={"count": 0})),
    ("pool-export-traces", edited(POOL, spec__telemetry={"exportTraces": True})),
]


@pytest.mark.parametrize("document", [case[1] for case in WELL_FORMED], ids=[case[0] for case in WELL_FORMED])
def test_well_formed_objects_are_accepted(
    kube_cluster: Any, namespace: str, document: dict[str, Any]
) -> None:
    result = kube_cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(document), check=False
    )
    assert result.returncode == 0, result.stderr
    load_resource(document)  # and the models agree


@pytest.mark.parametrize(
    ("document", "fragments"), [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED]
)
def test_malformed_objects_are_rejected_naming_the_field(
    kube_cluster: Any, namespace: str, document: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    result = kube_cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(document), check=False
    )
    assert result.returncode != 0, f"accepted: {yaml.safe_dump(document['spec'])}"
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_malformed_table_is_also_rejected_by_the_models() -> None:
    """The models enforce the same rules offline (local runs); a case only the apiserver catches is a gap."""
    accepted = []
    for case_id, document, _ in MALFORMED:
        try:
            load_resource(document)
        except ResourceError:
            continue
        accepted.append(case_id)
    assert accepted == []


def test_training_run_model_and_reward_are_immutable(kube_cluster: Any, namespace: str) -> None:
    run = edited(RUN, metadata__name="immutable-run")
    assert apply(kube_cluster, namespace, run).returncode == 0

    changed_model = edited(run, spec__model={"base": "s3://models/other"})
    result = apply(kube_cluster, namespace, changed_model)
    assert result.returncode != 0 and "spec.model is immutable" in result.stderr, result.stderr

    changed_reward = edited(run, spec__reward={"precision": "tf32"})
    result = apply(kube_cluster, namespace, changed_reward)
    assert result.returncode != 0 and "spec.reward is immutable" in result.stderr, result.stderr

    # Mutable fields still change: suspending and extending a run are normal operations.
    resumed = edited(run, spec__suspend=True, spec__algorithm={"steps": 300})
    result = apply(kube_cluster, namespace, resumed)
    assert result.returncode == 0, result.stderr


def test_sandbox_pool_gpu_resource_name_is_immutable(kube_cluster: Any, namespace: str) -> None:
    pool = edited(POOL, metadata__name="immutable-pool")
    assert apply(kube_cluster, namespace, pool).returncode == 0

    result = kube_cluster.kubectl(
        "patch", "sandboxpool", "immutable-pool", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"gpu": {"resourceName": "nvidia.com/mig-1g.10gb"}}}), check=False,
    )  # fmt: skip
    assert result.returncode != 0, result.stdout
    assert "spec.gpu.resourceName is immutable" in result.stderr, result.stderr

    result = kube_cluster.kubectl(
        "patch", "sandboxpool", "immutable-pool", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"gpu": {"count": 2}}}), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr

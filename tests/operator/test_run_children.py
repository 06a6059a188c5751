"""TrainingRun children: trainer RBAC scope, Ray cluster shapes, what the driver is told."""

from __future__ import annotations

from typing import Any

from cuda_agent.api.run_contract import TRAINER_METRICS_PORT, TrainerEnv
from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.operator import labels as lb
from cuda_agent.operator.run_children import (
    RunContext,
    driver_pod,
    ray_cluster,
    ray_pods,
    role,
    run_config,
    worker_gpus,
)

RUN = RunContext(
    name="run",
    namespace="team",
    uid="uid-2",
    image="registry/trainer:1",
    artifacts_secret="artifacts",
    checkpoint_prefix="s3://bucket/team/run/checkpoints",
    otel_endpoint="http://otel:4318",
    resume_from=None,
)
SPEC = {
    "model": {"base": "s3://models/qwen"},
    "dataset": {"uri": "s3://data/ops"},
    "sandboxPoolRef": {"name": "pool"},
}


def spec(**resources: Any) -> TrainingRunSpec:
    return TrainingRunSpec.model_validate({**SPEC, "resources": resources} if resources else SPEC)


def test_workers_pack_eight_gpus_per_pod() -> None:
    assert worker_gpus(spec()) == [8, 8]  # defaults: 8 trainer + 8 rollout
    assert worker_gpus(spec(trainerGpus=2, rolloutGpus=0)) == [2]
    assert worker_gpus(spec(trainerGpus=12, rolloutGpus=8)) == [8, 8, 4]


def test_trainer_role_reads_and_writes_status_of_this_run_only() -> None:
    rules = role(RUN)["rules"]
    assert all(rule["resourceNames"] == ["run"] for rule in rules)
    status_rule = next(rule for rule in rules if rule["resources"] == ["trainingruns/status"])
    assert set(status_rule["verbs"]) == {"get", "patch", "update"}
    assert all("create" not in rule["verbs"] and "delete" not in rule["verbs"] for rule in rules)


def test_driver_gets_pool_address_storage_otel_and_resume_point() -> None:
    resumed = RunContext(
        **{
            **RUN.__dict__,
            "resume_from": "s3://bucket/team/run/checkpoints/step-40",
            "artifacts_keys": ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        }
    )
    pod = driver_pod(resumed, spec(), kuberay=False)
    container = pod["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert container["command"] == ["cuda-agent", "train", "-f", "/etc/cuda-agent/run.yaml"]
    assert env["CUDA_AGENT_SANDBOX_URL"] == "http://pool.team.svc:8470"
    assert env["CUDA_AGENT_RESUME_FROM"] == "s3://bucket/team/run/checkpoints/step-40"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel:4318"
    assert env["RAY_ADDRESS"] == "ray://run-ray-head.team.svc:10001"
    # The artifacts Secret's storage keys, each by name: no other key of it reaches the trainer.
    assert "envFrom" not in container
    secret_refs = {
        item["name"]: item["valueFrom"]["secretKeyRef"] for item in container["env"] if "valueFrom" in item
    }
    assert secret_refs == {
        key: {"name": "artifacts", "key": key}
        for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    assert pod["spec"]["serviceAccountName"] == "run-trainer"
    assert pod["spec"]["automountServiceAccountToken"] is True and pod["spec"]["restartPolicy"] == "OnFailure"
    assert pod["metadata"]["labels"][lb.SANDBOX_CLIENT_LABEL] == "pool"


def test_only_the_driver_serves_trainer_metrics_on_its_named_port() -> None:
    """The driver runs the training loop, whose families the trainer serves (a PodMonitor selects its port
    `metrics`); the Ray head and workers run `ray start`, which serves none of them."""
    container = driver_pod(RUN, spec(), kuberay=False)["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["CUDA_AGENT_METRICS_PORT"] == str(TRAINER_METRICS_PORT)
    assert TrainerEnv.from_environ(env).metrics_port == TRAINER_METRICS_PORT
    assert {"name": "metrics", "containerPort": TRAINER_METRICS_PORT, "protocol": "TCP"} in container["ports"]
    for pod in ray_pods(RUN, spec(trainerGpus=4, rolloutGpus=4)):
        ray = pod["spec"]["containers"][0]
        assert "CUDA_AGENT_METRICS_PORT" not in {item["name"] for item in ray["env"]}
        assert all(port.get("name") != "metrics" for port in ray["ports"])


def test_driver_under_kuberay_talks_to_the_kuberay_head_service() -> None:
    container = driver_pod(RUN, spec(), kuberay=True)["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["RAY_ADDRESS"] == "ray://run-head-svc.team.svc:10001"


def test_own_ray_pods_are_restricted_and_request_gpus() -> None:
    pods = ray_pods(RUN, spec(trainerGpus=4, rolloutGpus=4))
    assert [p["metadata"]["name"] for p in pods] == ["run-ray-head", "run-ray-worker-0"]
    head, worker = (p["spec"]["containers"][0] for p in pods)
    assert "nvidia.com/gpu" not in head["resources"]["limits"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    for pod in pods:
        context = pod["spec"]["containers"][0]["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
        assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-2"


def test_raycluster_groups_workers_by_gpu_count() -> None:
    cluster = ray_cluster(RUN, spec(trainerGpus=12, rolloutGpus=8))
    groups = {g["groupName"]: g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]}
    assert groups == {"gpu4": 1, "gpu8": 2}
    assert cluster["apiVersion"] == "ray.io/v1"


def test_run_file_is_the_run_itself() -> None:
    import yaml

    document = yaml.safe_load(run_config(RUN, SPEC)["data"]["run.yaml"])
    assert document["kind"] == "TrainingRun" and document["spec"] == SPEC

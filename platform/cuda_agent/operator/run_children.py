"""The children of a TrainingRun, built as plain manifests from its spec (pure: no I/O).

The trainer runs on a Ray cluster: a KubeRay `RayCluster` when that CRD is installed (KubeRay then owns
the pods), otherwise a head pod, its Service and worker pods that the run owns directly. A driver pod runs
the trainer entry point against that cluster. Trainer pods get a ServiceAccount whose Role can only read
this run and write its status, which is how the trainer reports progress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

from cuda_agent.api.episode import episode_settings
from cuda_agent.api.run_contract import TRAINER_METRICS_PORT, TrainerEnv
from cuda_agent.api.sandbox import SANDBOX_PORT
from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.operator import labels as lb
from cuda_agent.operator.kube import Manifest
from cuda_agent.operator.manifests import owner_reference, with_hash

RUN_CONFIG_DIR = "/etc/cuda-agent"
TRAINER_UID = 1000
GPUS_PER_WORKER = 8  # one worker pod per 8-GPU node
RAY_GCS_PORT = 6379
RAY_CLIENT_PORT = 10001
RAY_DASHBOARD_PORT = 8265
RAY_VERSION = "2.60.0"


# Gang schedulers the operator hands a run's Ray pods to, when their API is served (see admission.py).
KUEUE = "kueue"
COSCHEDULING = "coscheduling"  # kubernetes-sigs/scheduler-plugins
VOLCANO = "volcano"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POD_GROUP_APIS = {COSCHEDULING: "scheduling.x-k8s.io/v1alpha1", VOLCANO: "scheduling.volcano.sh/v1beta1"}


@dataclass(frozen=True)
class GangScheduling:
    """How a run's Ray head and workers are placed all together by an installed gang scheduler; the
    default (no mechanism) means the operator's own capacity check admitted them."""

    mechanism: str = ""  # "", KUEUE, COSCHEDULING or VOLCANO
    queue: str = ""  # Kueue LocalQueue
    scheduler_name: str = ""  # the coscheduling scheduler's name (a second scheduler)


@dataclass(frozen=True)
class RunContext:
    """Everything a run's children depend on besides its spec."""

    name: str
    namespace: str
    uid: str
    image: str
    artifacts_secret: str
    checkpoint_prefix: str
    otel_endpoint: str | None
    resume_from: str | None  # status.lastCheckpoint when the compute is (re)created
    pod_annotations: tuple[tuple[str, str], ...] = ()  # put on every trainer pod (e.g. for a mesh)
    gang: GangScheduling = GangScheduling()
    # The run's SandboxPool as the operator observed it (the local executor: as its server on this machine
    # serves it); the episodes' device comes from it. None: not observed, so no episode settings.
    pool: SandboxPoolSpec | None = None
    # The artifacts Secret's storage keys the trainer gets, each by name (tenancy.ARTIFACTS_ENV_NAMES
    # present in the Secret); no other key of it reaches a trainer's environment.
    artifacts_keys: tuple[str, ...] = ()


def pod_group_name(run: RunContext) -> str:
    return f"{run.name}-ray"


def _gang_pod_fields(run: RunContext, spec: TrainingRunSpec) -> tuple[dict[str, str], dict[str, str], str]:
    """(labels, annotations, schedulerName) that put a Ray pod of the run into its gang."""
    gang, group = run.gang, pod_group_name(run)
    if gang.mechanism == KUEUE:  # Kueue's plain-pod integration admits the whole group at once
        return (
            {KUEUE_QUEUE_LABEL: gang.queue, "kueue.x-k8s.io/pod-group-name": group},
            {"kueue.x-k8s.io/pod-group-total-count": str(1 + len(worker_gpus(spec)))},
            "",
        )
    if gang.mechanism == COSCHEDULING:
        return {"scheduling.x-k8s.io/pod-group": group}, {}, gang.scheduler_name
    if gang.mechanism == VOLCANO:
        return {}, {"scheduling.k8s.io/group-name": group}, "volcano"
    return {}, {}, ""


def pod_group(run: RunContext, spec: TrainingRunSpec) -> Manifest | None:
    """The PodGroup of scheduler-plugins' coscheduling or of Volcano: the Ray head and every worker
    are bound together or not at all."""
    api_version = POD_GROUP_APIS.get(run.gang.mechanism)
    if api_version is None:
        return None
    gpus = sum(worker_gpus(spec))
    group: dict[str, Any] = {
        "minMember": 1 + len(worker_gpus(spec)),
        "minResources": {"nvidia.com/gpu": str(gpus)},
    }
    if run.gang.mechanism == COSCHEDULING:
        group["scheduleTimeoutSeconds"] = spec.run_policy.start_timeout_seconds
    return with_hash(
        {
            "apiVersion": api_version,
            "kind": "PodGroup",
            "metadata": _metadata(run, pod_group_name(run), lb.COMPONENT_RAY_HEAD),
            "spec": group,
        }
    )


def cluster_gang_labels(run: RunContext) -> dict[str, str]:
    """On a KubeRay RayCluster: Kueue admits RayClusters itself, and KubeRay creates the PodGroup of
    its configured batch scheduler when asked to."""
    if run.gang.mechanism == KUEUE:
        return {KUEUE_QUEUE_LABEL: run.gang.queue}
    if run.gang.mechanism in POD_GROUP_APIS:
        return {"ray.io/gang-scheduling-enabled": "true"}
    return {}


def _metadata(
    run: RunContext, name: str, component: str, extra_labels: dict[str, str] | None = None
) -> Manifest:
    return {
        "name": name,
        "namespace": run.namespace,
        "labels": {**lb.child_labels(lb.RUN_LABEL, run.name, component), **(extra_labels or {})},
        "ownerReferences": [owner_reference(lb.API_VERSION, lb.RUN_KIND, run.name, run.uid)],
    }


def _pod_metadata(run: RunContext, name: str, component: str, extra_labels: dict[str, str]) -> Manifest:
    metadata = _metadata(run, name, component, extra_labels)
    if run.pod_annotations:
        metadata["annotations"] = dict(run.pod_annotations)
    return metadata


def worker_gpus(spec: TrainingRunSpec) -> list[int]:
    """GPUs of each Ray worker pod: trainer plus rollout GPUs, packed eight to a pod."""
    total = spec.resources.trainer_gpus + spec.resources.rollout_gpus
    count = math.ceil(total / GPUS_PER_WORKER)
    return [min(GPUS_PER_WORKER, total - i * GPUS_PER_WORKER) for i in range(count)]


def service_account(run: RunContext) -> Manifest:
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(run, lb.trainer_account_name(run.name), lb.COMPONENT_DRIVER),
            "automountServiceAccountToken": False,
        }
    )


def role(run: RunContext) -> Manifest:
    """Read this one run (the trainer watches spec.suspend) and patch its status: nothing else."""
    return with_hash(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _metadata(run, lb.trainer_account_name(run.name), lb.COMPONENT_DRIVER),
            "rules": [
                {
                    "apiGroups": [lb.GROUP],
                    "resources": [lb.RUN_PLURAL],
                    "resourceNames": [run.name],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": [lb.GROUP],
                    "resources": [f"{lb.RUN_PLURAL}/status"],
                    "resourceNames": [run.name],
                    "verbs": ["get", "patch", "update"],
                },
            ],
        }
    )


def role_binding(run: RunContext) -> Manifest:
    account = lb.trainer_account_name(run.name)
    return with_hash(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(run, account, lb.COMPONENT_DRIVER),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": run.namespace}],
        }
    )


def run_config(run: RunContext, spec: Manifest) -> Manifest:
    """`run.yaml` for `cuda-agent train -f`: the TrainingRun as the user wrote it (after defaulting)."""
    document = {
        "apiVersion": lb.API_VERSION,
        "kind": lb.RUN_KIND,
        "metadata": {"name": run.name, "namespace": run.namespace},
        "spec": spec,
    }
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(run, lb.run_config_name(run.name), lb.COMPONENT_DRIVER),
            "data": {"run.yaml": yaml.safe_dump(document, sort_keys=False)},
        }
    )


def pool_sandbox_url(spec: TrainingRunSpec, namespace: str) -> str:
    """The run's SandboxPool as a trainer pod reaches it: the pool's headless Service."""
    return f"http://{lb.pool_service_host(spec.sandbox_pool_ref.name, namespace)}:{SANDBOX_PORT}"


def trainer_env(
    run: RunContext,
    spec: TrainingRunSpec,
    sandbox_url: str,
    ray_address: str | None,
    metrics_port: int | None = None,
) -> TrainerEnv:
    """What every trainer process is told (pod or local process): the operator <-> trainer contract,
    with the settings every episode's session gets (device from the observed pool, judge options from
    spec.reward). It reports progress by patching its run's status (in a pod through its ServiceAccount),
    and serves /metrics on `metrics_port` (the driver; Ray's own pods serve none)."""
    return TrainerEnv(
        run_name=run.name,
        run_namespace=run.namespace,
        sandbox_url=sandbox_url,
        checkpoint_prefix=run.checkpoint_prefix,
        resume_from=run.resume_from,
        episode=episode_settings(spec, run.pool) if run.pool is not None else None,
        status_mode="kubernetes",
        ray_address=ray_address or None,
        otel_endpoint=run.otel_endpoint,
        metrics_port=metrics_port,
    )


def _env(
    run: RunContext, spec: TrainingRunSpec, ray_address: str, metrics_port: int | None
) -> list[dict[str, Any]]:
    sandbox_url = pool_sandbox_url(spec, run.namespace)
    environ = trainer_env(run, spec, sandbox_url, ray_address, metrics_port).to_environ()
    return [{"name": name, "value": value} for name, value in environ.items()]


def _artifacts_env(run: RunContext) -> list[dict[str, Any]]:
    """The artifacts Secret's storage settings, each by name (not `envFrom`, which would make every key
    the run's author puts into the Secret part of the trainer's environment)."""
    return [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": run.artifacts_secret, "key": key}}}
        for key in run.artifacts_keys
    ]


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": TRAINER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_spec(
    run: RunContext,
    spec: TrainingRunSpec,
    command: list[str],
    gpus: int,
    ray_address: str,
    ports: list[int],
    metrics_port: int | None = None,
) -> dict[str, Any]:
    """Pod spec shared by Ray head, workers and the driver (restricted Pod Security, like the sandboxes);
    `metrics_port`: the trainer serves /metrics there, as the container's port `metrics`."""
    container_ports: list[dict[str, Any]] = [{"containerPort": port} for port in ports]
    if metrics_port is not None:
        container_ports.append({"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"})
    resources: dict[str, dict[str, str]] = {
        "requests": {"cpu": "1", "memory": "4Gi"},
        "limits": {"memory": "64Gi"},
    }
    pod: dict[str, Any] = {
        "serviceAccountName": lb.trainer_account_name(run.name),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": TRAINER_UID,
            "fsGroup": TRAINER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "trainer",
                "image": run.image,
                "command": command,
                "env": _env(run, spec, ray_address, metrics_port) + _artifacts_env(run),
                "ports": container_ports,
                "resources": resources,
                "securityContext": _security_context(),
                "volumeMounts": [
                    {"name": "run-config", "mountPath": RUN_CONFIG_DIR, "readOnly": True},
                    {"name": "shm", "mountPath": "/dev/shm"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }
        ],
        "volumes": [
            {"name": "run-config", "configMap": {"name": lb.run_config_name(run.name)}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if gpus > 0:
        for key in ("requests", "limits"):
            resources[key]["nvidia.com/gpu"] = str(gpus)
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return pod


def _head_command() -> list[str]:
    return [
        "ray", "start", "--head", "--block", "--num-gpus=0", f"--port={RAY_GCS_PORT}",
        f"--ray-client-server-port={RAY_CLIENT_PORT}", "--dashboard-host=0.0.0.0",
    ]  # fmt: skip


def _worker_command(head_host: str, gpus: int) -> list[str]:
    return ["ray", "start", "--block", f"--address={head_host}:{RAY_GCS_PORT}", f"--num-gpus={gpus}"]


def _client_labels(spec: TrainingRunSpec) -> dict[str, str]:
    # Admitted by the pool's NetworkPolicy: rollouts on workers and the driver open sandbox sessions.
    return {lb.SANDBOX_CLIENT_LABEL: spec.sandbox_pool_ref.name}


def ray_head_host(run: RunContext, kuberay: bool) -> str:
    """DNS name of the Ray head Service (KubeRay names it `<cluster>-head-svc`)."""
    service = f"{run.name}-head-svc" if kuberay else lb.ray_head_name(run.name)
    return f"{service}.{run.namespace}.svc"


def ray_pods(run: RunContext, spec: TrainingRunSpec) -> list[Manifest]:
    """Head and worker pods of a Ray cluster the run owns (no KubeRay), in the run's gang."""
    pods = [with_hash(_in_gang(run, spec, pod)) for pod in _ray_pods(run, spec)]
    return pods


def _in_gang(run: RunContext, spec: TrainingRunSpec, pod: Manifest) -> Manifest:
    labels, annotations, scheduler = _gang_pod_fields(run, spec)
    pod["metadata"]["labels"].update(labels)
    if annotations:
        pod["metadata"]["annotations"] = {**pod["metadata"].get("annotations", {}), **annotations}
    if scheduler:
        pod["spec"]["schedulerName"] = scheduler
    return pod


def _ray_pods(run: RunContext, spec: TrainingRunSpec) -> list[Manifest]:
    head_host = ray_head_host(run, kuberay=False)
    head = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _pod_metadata(
            run, lb.ray_head_name(run.name), lb.COMPONENT_RAY_HEAD, _client_labels(spec)
        ),
        "spec": {
            **_pod_spec(
                run, spec, _head_command(), 0, "", [RAY_GCS_PORT, RAY_CLIENT_PORT, RAY_DASHBOARD_PORT]
            ),
            "hostname": lb.ray_head_name(run.name),
            "restartPolicy": "Always",
        },
    }
    workers = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": _pod_metadata(
                run, lb.ray_worker_name(run.name, index), lb.COMPONENT_RAY_WORKER, _client_labels(spec)
            ),
            "spec": {
                **_pod_spec(run, spec, _worker_command(head_host, gpus), gpus, "", []),
                "restartPolicy": "Always",
            },
        }
        for index, gpus in enumerate(worker_gpus(spec))
    ]
    return [head, *workers]


def ray_head_service(run: RunContext) -> Manifest:
    name = lb.ray_head_name(run.name)
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(run, name, lb.COMPONENT_RAY_HEAD),
            "spec": {
                "selector": {lb.RUN_LABEL: run.name, lb.COMPONENT: lb.COMPONENT_RAY_HEAD},
                "ports": [
                    {"name": "gcs", "port": RAY_GCS_PORT},
                    {"name": "client", "port": RAY_CLIENT_PORT},
                    {"name": "dashboard", "port": RAY_DASHBOARD_PORT},
                ],
            },
        }
    )


def ray_cluster(run: RunContext, spec: TrainingRunSpec) -> Manifest:
    """A KubeRay RayCluster: one CPU head group and one worker group per distinct worker GPU count."""
    groups: dict[int, int] = {}
    for gpus in worker_gpus(spec):
        groups[gpus] = groups.get(gpus, 0) + 1
    labels = {**lb.child_labels(lb.RUN_LABEL, run.name, lb.COMPONENT_RAY_WORKER), **_client_labels(spec)}

    def template(gpus: int, component: str) -> dict[str, Any]:
        pod = _pod_spec(run, spec, [], gpus, "", [])
        del pod["containers"][0]["command"]  # KubeRay generates `ray start` from rayStartParams
        metadata = {"labels": {**labels, lb.COMPONENT: component}, "annotations": dict(run.pod_annotations)}
        return {"metadata": metadata, "spec": pod}

    return with_hash(
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": _metadata(run, run.name, lb.COMPONENT_RAY_HEAD, cluster_gang_labels(run)),
            "spec": {
                "rayVersion": RAY_VERSION,
                "headGroupSpec": {
                    "rayStartParams": {"num-gpus": "0", "dashboard-host": "0.0.0.0"},
                    "template": template(0, lb.COMPONENT_RAY_HEAD),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": f"gpu{gpus}",
                        "replicas": count,
                        "minReplicas": count,
                        "maxReplicas": count,
                        "rayStartParams": {"num-gpus": str(gpus)},
                        "template": template(gpus, lb.COMPONENT_RAY_WORKER),
                    }
                    for gpus, count in sorted(groups.items())
                ],
            },
        }
    )


def driver_pod(run: RunContext, spec: TrainingRunSpec, kuberay: bool) -> Manifest:
    """The trainer entry point, run against the Ray cluster; the one pod that writes the run's status.

    A pod owned by the run rather than a Job: the operator already decides what a run's end means
    (Succeeded, Failed, suspended), and `OnFailure` restarts a crashed trainer in place, where it resumes
    from the checkpoint in the run's status; too many restarts fail the run.
    """
    ray_address = f"ray://{ray_head_host(run, kuberay)}:{RAY_CLIENT_PORT}"
    command = ["cuda-agent", "train", "-f", f"{RUN_CONFIG_DIR}/run.yaml"]
    pod = _pod_spec(run, spec, command, 0, ray_address, [], metrics_port=TRAINER_METRICS_PORT)
    pod["automountServiceAccountToken"] = True  # it reports progress through the run's status
    pod["restartPolicy"] = "OnFailure"
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": _pod_metadata(
                run, lb.driver_name(run.name), lb.COMPONENT_DRIVER, _client_labels(spec)
            ),
            "spec": pod,
        }
    )

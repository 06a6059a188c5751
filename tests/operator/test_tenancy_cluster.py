"""A cluster shared by teams (issue 31), against the real apiserver, scheduler and kwok: what a run's
author (its spec, annotations, the artifacts Secret) and its trainer's ServiceAccount (the status) write
is validated input, never a decision.

* the trainer image is the admin's: a run's annotation may only pick one the admin allowed;
* checkpoints stay under `s3://<bucket>/<namespace>/`, and a run resumes only from its own prefix;
* a forged status (phase, startTime, conditions) is written over, before and after an operator restart,
  and the deadline still counts from the operator's own record; a pool's forged status likewise;
* foreign conditions neither freeze the status nor start a hot loop;
* a stranger's Pending pod blocks no admission, and a started run whose recreated pod cannot be placed
  times out;
* a run whose pool or Secret is gone still honours suspend and its deadline;
* a drain mark without a zone does not crash-loop its pool.
Each of these failed before the issue's changes (see the issue's list for what happened instead).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fixtures.cluster import KubeCluster
from operator_harness import Namespace, OperatorProcess, metric_value, pool_manifest, wait_for
from test_run_cluster import artifacts_secret, as_trainer, report, run_manifest

from cuda_agent.localhost import free_port

ADMIN_IMAGE = "registry.example/cuda-agent/trainer:admin"
ALLOWED_IMAGE = "registry.example/cuda-agent/trainer:gpu-v2"


def small_run(name: str, **spec: Any) -> dict[str, Any]:
    """A run of one 1-GPU Ray worker."""
    manifest = run_manifest(name=name)
    manifest["spec"]["resources"] = {"trainerGpus": 1, "rolloutGpus": 0}
    manifest["spec"].update(spec)
    return manifest


def status(ns: Namespace, name: str) -> dict[str, Any]:
    return dict((ns.get_or_none("trainingrun", name) or {}).get("status") or {})


def condition(ns: Namespace, name: str, kind: str) -> dict[str, Any]:
    return ns.condition(f"trainingrun/{name}", kind) or {}


def pods_of(ns: Namespace, name: str) -> list[dict[str, Any]]:
    pods = ns.items("pods", "-l", f"cuda-agent.io/training-run={name}")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def driver_env(ns: Namespace, name: str) -> dict[str, str]:
    container = ns.get("pod", f"{name}-driver")["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def foreign_conditions(count: int) -> list[dict[str, Any]]:
    return [
        {
            "type": f"Forged{i}",
            "status": "True",
            "reason": "Forged",
            "message": "",
            "lastTransitionTime": now(),
        }
        for i in range(count)
    ]


def setup(ns: Namespace) -> None:
    ns.apply(pool_manifest("pool", 0))
    ns.apply(artifacts_secret())


def test_the_trainer_image_is_the_admins_a_run_may_pick_only_an_allowed_one(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator_factory("--trainer-image", ADMIN_IMAGE, "--allowed-trainer-image", ALLOWED_IMAGE)
    setup(namespace)
    evil = small_run("evil")
    evil["metadata"]["annotations"] = {"cuda-agent.io/trainer-image": "evil.example/miner:1\nrm -rf /"}
    picked = small_run("picked")
    picked["metadata"]["annotations"] = {"cuda-agent.io/trainer-image": ALLOWED_IMAGE}
    for manifest in (evil, picked, small_run("plain")):
        namespace.apply(manifest)

    for name, image in (("picked", ALLOWED_IMAGE), ("plain", ADMIN_IMAGE)):
        wait_for(lambda name=name: status(namespace, name).get("phase") == "WarmingUp", f"{name} to start")
        assert {p["spec"]["containers"][0]["image"] for p in pods_of(namespace, name)} == {image}
    blocked = condition(namespace, "evil", "Provisioning")
    assert (blocked["status"], blocked["reason"]) == ("False", "TrainerImageNotAllowed")
    assert ALLOWED_IMAGE in blocked["message"] and ADMIN_IMAGE in blocked["message"]
    assert status(namespace, "evil")["phase"] == "Pending" and not pods_of(namespace, "evil")


def test_storage_stays_in_the_namespace_and_a_run_resumes_only_from_its_own_prefix(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    port = free_port()
    operator_factory("--suspend-checkpoint-timeout", "600", "--metrics-port", str(port))
    setup(namespace)
    stolen = small_run("stolen")
    stolen["spec"]["checkpoint"] = {"prefix": "s3://cuda-agent/another-team/run/uid/checkpoints"}
    root = small_run("root")
    root["spec"]["checkpoint"] = {"prefix": "s3://cuda-agent/latest"}
    for manifest in (stolen, root, small_run("run")):
        namespace.apply(manifest)

    wait_for(lambda: status(namespace, "run").get("phase") == "WarmingUp", "the run to start")
    for name in ("stolen", "root"):
        blocked = condition(namespace, name, "Provisioning")
        assert (blocked["status"], blocked["reason"]) == ("False", "CheckpointPrefixNotAllowed")
        assert f"s3://cuda-agent/{namespace.name}/" in blocked["message"] and not pods_of(namespace, name)
    uid = namespace.get("trainingrun", "run")["metadata"]["uid"]
    prefix = f"s3://cuda-agent/{namespace.name}/run/{uid}/checkpoints"
    assert driver_env(namespace, "run")["CUDA_AGENT_CHECKPOINT_PREFIX"] == prefix

    # Suspended: another namespace's checkpoint in lastCheckpoint is not the trainer's checkpoint...
    namespace.kubectl("patch", "trainingrun", "run", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(
        lambda: condition(namespace, "run", "Suspended").get("reason") == "Checkpointing", "Checkpointing"
    )
    report(namespace, {"lastCheckpoint": "s3://cuda-agent/another-team/run/uid/checkpoints/ckpt-000009"})
    passes = metric_value(port, "TrainingRun")
    wait_for(lambda: metric_value(port, "TrainingRun") >= passes + 3, "passes over the forged report")
    assert condition(namespace, "run", "Suspended")["reason"] == "Checkpointing" and pods_of(namespace, "run")
    # ... its own is.
    report(namespace, {"lastCheckpoint": f"{prefix}/ckpt-000003"})
    wait_for(lambda: status(namespace, "run").get("phase") == "Suspended", "Suspended")
    wait_for(lambda: not pods_of(namespace, "run"), "the compute to go")

    # Resumed with a foreign checkpoint in the status: no resume point (the trainer then resumes from the
    # newest checkpoint under its own prefix by itself).
    report(namespace, {"lastCheckpoint": "s3://cuda-agent/another-team/run/uid/checkpoints/ckpt-000009"})
    namespace.kubectl("patch", "trainingrun", "run", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: namespace.get_or_none("pod", "run-driver"), "the driver again")
    assert "CUDA_AGENT_RESUME_FROM" not in driver_env(namespace, "run")
    # And from its own checkpoint, once the trainer reports one at the next suspension.
    namespace.kubectl("patch", "trainingrun", "run", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(
        lambda: condition(namespace, "run", "Suspended").get("reason") == "Checkpointing", "Checkpointing"
    )
    report(namespace, {"lastCheckpoint": f"{prefix}/ckpt-000004"})
    wait_for(lambda: status(namespace, "run").get("phase") == "Suspended", "Suspended again")
    wait_for(lambda: not pods_of(namespace, "run"), "the compute to go again")
    namespace.kubectl("patch", "trainingrun", "run", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: namespace.get_or_none("pod", "run-driver"), "the driver once more")
    assert driver_env(namespace, "run")["CUDA_AGENT_RESUME_FROM"] == f"{prefix}/ckpt-000004"


def test_forged_status_is_written_over_and_decides_nothing_even_after_a_restart(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    port = free_port()
    operator = operator_factory("--metrics-port", str(port))
    setup(namespace)
    namespace.apply(small_run("run", runPolicy={"startTimeoutSeconds": 20, "activeDeadlineSeconds": 45}))
    wait_for(lambda: status(namespace, "run").get("phase") == "WarmingUp", "the run to start")
    started = status(namespace, "run")["startTime"]
    forged = {
        "phase": "Succeeded",
        "startTime": "2099-01-01T00:00:00Z",  # a deadline that would never fire
        "conditions": [
            {
                "type": "Succeeded",
                "status": "True",
                "reason": "Forged",
                "message": "",
                "lastTransitionTime": now(),
            }
        ],
    }

    # While the operator runs: its next pass writes its own fields back.
    report(namespace, forged)
    wait_for(
        lambda: (s := status(namespace, "run")).get("phase") == "WarmingUp" and s.get("startTime") == started,
        "the forged status to be written over",
        timeout=30,
    )
    assert condition(namespace, "run", "Succeeded")["status"] == "False"

    # While it is down: the restarted operator decides from its own record, not from the forged status.
    operator.kill()
    report(namespace, forged)
    operator.start()
    wait_for(lambda: metric_value(port, "TrainingRun") >= 1, "the new operator's first pass")
    wait_for(
        lambda: (s := status(namespace, "run")).get("phase") == "WarmingUp" and s.get("startTime") == started,
        "the forged status to be written over after the restart",
        timeout=30,
    )
    assert len(pods_of(namespace, "run")) == 3  # head, worker and driver: nothing was removed
    failed = wait_for(
        lambda: condition(namespace, "run", "Failed").get("status") == "True", "the deadline", 90
    )
    assert failed and condition(namespace, "run", "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: [p["metadata"]["name"] for p in pods_of(namespace, "run")] == [], "the compute to go")

    # A pool's status (an HPA reads selector and replicas) is written over too.
    namespace.apply(pool_manifest("sized", 1))
    wait_for(
        lambda: (namespace.get("sandboxpool", "sized").get("status") or {}).get("readyReplicas") == 1, "ready"
    )
    patch = {"status": {"selector": "app=anything", "readyReplicas": 9, "replicas": 9}}
    namespace.kubectl(
        "patch", "sandboxpool", "sized", "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )
    wait_for(
        lambda: (
            (s := namespace.get("sandboxpool", "sized")["status"]).get("readyReplicas") == 1
            and s.get("selector") == "app.kubernetes.io/component=sandbox,cuda-agent.io/sandbox-pool=sized"
        ),
        "the pool's forged status to be written over",
        timeout=30,
    )


def test_foreign_conditions_neither_freeze_the_status_nor_start_a_hot_loop(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator = operator_factory()
    setup(namespace)
    namespace.apply(small_run("run"))
    wait_for(lambda: status(namespace, "run").get("phase") == "WarmingUp", "the run to start")

    # The trainer's ServiceAccount fills the status with 16 conditions (the schema's maximum).
    report(namespace, {"conditions": foreign_conditions(16)})
    wait_for(
        lambda: (
            {c["type"] for c in status(namespace, "run").get("conditions") or []}
            == {"Admitted", "Provisioning", "WarmingUp", "Training", "Suspended", "Succeeded", "Failed"}
        ),
        "only the operator's conditions",
        timeout=30,
    )
    # Then the trainer fails: the run still fails and lets go of its GPUs.
    report(namespace, {"conditions": foreign_conditions(16)})
    terminated = {"exitCode": 1, "reason": "Error", "startedAt": now(), "finishedAt": now()}
    container = {"name": "trainer", "image": ADMIN_IMAGE, "imageID": "", "ready": False, "restartCount": 0,
                 "state": {"terminated": terminated}}  # fmt: skip
    pod_status = {"status": {"phase": "Failed", "containerStatuses": [container]}}
    namespace.kubectl(
        "patch", "pod", "run-driver", "--subresource=status", "--type=merge", "-p", json.dumps(pod_status)
    )
    wait_for(lambda: status(namespace, "run").get("phase") == "Failed", "the run to fail", timeout=60)
    # kwok serves no logs: the message says why they could not be read, not HTTP 406 (issue 31, item 9).
    message = condition(namespace, "run", "Failed")["message"]
    assert "could not be read" in message and "406" not in message, message
    wait_for(
        lambda: [p["metadata"]["name"] for p in pods_of(namespace, "run")] == ["run-driver"],
        "the Ray pods to go (the ended driver stays for its logs)",
    )
    refused = [line for line in operator.log_text().splitlines() if "not written" in line]
    assert len(refused) <= 2, refused[:5]  # a refused write waits for the error backoff, never 0 s

    # A pool with 13 foreign conditions (13 + its 4 > 16): written over, no ReconcileError loop.
    namespace.apply(pool_manifest("crowded", 1))
    wait_for(lambda: namespace.condition("sandboxpool/crowded", "Ready"), "the pool's status")
    patch = {"status": {"conditions": foreign_conditions(13)}}
    namespace.kubectl(
        "patch", "sandboxpool", "crowded", "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )
    wait_for(
        lambda: (
            {c["type"] for c in namespace.get("sandboxpool", "crowded")["status"].get("conditions") or []}
            == {"Ready", "Scaling", "Degraded", "LoadReported"}
        ),
        "only the pool's own conditions",
        timeout=30,
    )
    assert not namespace.events("ReconcileError")


@pytest.fixture
def cordoned(kube_cluster: KubeCluster) -> Iterator[Callable[[], None]]:
    """Cordons every node when called (nothing new can be placed); always uncordoned afterwards."""
    nodes = [
        n["metadata"]["name"]
        for n in json.loads(kube_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    ]

    def cordon() -> None:
        kube_cluster.kubectl("cordon", *nodes)

    yield cordon
    kube_cluster.kubectl("uncordon", *nodes, check=False)


def test_a_strangers_pending_pod_blocks_no_admission_and_an_unplaceable_restart_times_out(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess], cordoned: Callable[[], None]
) -> None:
    operator_factory()
    setup(namespace)
    # A pod that can never be placed (9 GPUs; nodes have 8), labelled as a run's: not the operator's.
    ghost = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ghost", "labels": {"cuda-agent.io/training-run": "ghost"}},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/ghost:1",
                    "resources": {"requests": {"nvidia.com/gpu": "9"}, "limits": {"nvidia.com/gpu": "9"}},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    namespace.apply(ghost)
    namespace.apply(small_run("run", runPolicy={"startTimeoutSeconds": 5}))
    wait_for(lambda: status(namespace, "run").get("phase") == "WarmingUp", "the run to be admitted and start")
    assert condition(namespace, "run", "Admitted")["reason"] == "GangAdmitted"

    # Its worker's node is lost and nothing can be placed any more: the recreated pod waits, Unschedulable,
    # and the started run times out with the scheduler's reason instead of holding its GPUs forever.
    cordoned()
    namespace.kubectl("delete", "pod", "run-ray-worker-0", "--grace-period=0", "--force")
    failed = wait_for(
        lambda: (c := condition(namespace, "run", "Failed")).get("status") == "True" and c, "the timeout", 90
    )
    assert failed["reason"] == "Unschedulable" and "not running again since" in failed["message"]
    wait_for(
        lambda: not [p for p in pods_of(namespace, "run") if p["metadata"]["name"] != "run-driver"], "release"
    )


def test_a_run_whose_pool_or_secret_is_gone_still_honours_suspend_and_its_deadline(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator_factory("--suspend-checkpoint-timeout", "3")
    setup(namespace)
    namespace.apply(small_run("timed"))
    namespace.apply(small_run("paused"))
    for name in ("timed", "paused"):
        wait_for(lambda name=name: status(namespace, name).get("phase") == "WarmingUp", f"{name} to start")

    namespace.kubectl("delete", "sandboxpool", "pool")
    blocked = wait_for(
        lambda: (
            (c := condition(namespace, "timed", "Provisioning")).get("reason") == "SandboxPoolNotFound" and c
        ),
        "the missing pool to be reported",
    )
    # The status says what runs (not Pending): the compute keeps its GPUs until something ends it.
    assert status(namespace, "timed")["phase"] == "WarmingUp" and len(pods_of(namespace, "timed")) == 3
    assert "keeps its GPUs" in blocked["message"]
    # A deadline set (or reached) while the pool is gone still ends the run and releases its GPUs.
    policy = {"spec": {"runPolicy": {"startTimeoutSeconds": 1, "activeDeadlineSeconds": 2}}}
    namespace.kubectl("patch", "trainingrun", "timed", "--type=merge", "-p", json.dumps(policy))
    wait_for(
        lambda: condition(namespace, "timed", "Failed").get("reason") == "DeadlineExceeded", "the deadline"
    )
    wait_for(lambda: len(pods_of(namespace, "timed")) <= 1, "the timed run's Ray pods to go")

    # The Secret goes too: suspend still checkpoints (here: times out) and scales to zero.
    namespace.kubectl("delete", "secret", "cuda-agent-artifacts")
    namespace.kubectl("patch", "trainingrun", "paused", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: status(namespace, "paused").get("phase") == "Suspended", "Suspended", timeout=60)
    wait_for(lambda: not pods_of(namespace, "paused"), "the paused run's compute to go")


def test_a_drain_mark_without_a_time_zone_does_not_crash_loop_the_pool(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator_factory("--drain-grace-period", "3600")
    namespace.apply(pool_manifest("pool", 2))
    wait_for(
        lambda: (namespace.get("sandboxpool", "pool").get("status") or {}).get("readyReplicas") == 2,
        "2 ready",
    )

    def mark() -> str | None:
        annotations = namespace.get("pod", "pool-1")["metadata"].get("annotations") or {}
        return annotations.get("cuda-agent.io/drain-since")

    # Scaled down, pool-1 drains (its pod does not report its sessions: the grace period holds it).
    namespace.kubectl("patch", "sandboxpool", "pool", "--type=merge", "-p", '{"spec":{"replicas":1}}')
    wait_for(mark, "pool-1's drain mark")
    # Someone who may edit pods rewrites the mark without a zone: not a clock that started. The operator
    # starts it again, with a zone, and keeps draining; it does not crash-loop on the comparison.
    namespace.kubectl(
        "annotate", "--overwrite", "pod", "pool-1", "cuda-agent.io/drain-since=2026-01-01T00:00:00"
    )
    rewritten = wait_for(
        lambda: (value := mark()) and value.endswith("Z") and value,
        "the drain mark to be rewritten",
        timeout=30,
    )
    assert datetime.fromisoformat(rewritten.replace("Z", "+00:00")).tzinfo is not None
    scaling = namespace.condition("sandboxpool/pool", "Scaling")
    assert scaling is not None and scaling["reason"] == "Draining"
    assert not namespace.events("ReconcileError")


def test_the_trainer_account_cannot_write_the_operators_record(namespace: Namespace) -> None:
    """The operator's record lives in the run's annotations because a status write (all the trainer's
    ServiceAccount may do) never changes metadata: the apiserver keeps everything but the status."""
    namespace.apply(small_run("run"))
    namespace.kubectl("create", "serviceaccount", "run-trainer")
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "run-trainer"},
        "rules": [
            {"apiGroups": ["cuda-agent.io"], "resources": ["trainingruns/status"], "verbs": ["get", "patch"]}
        ],
    }  # fmt: skip
    namespace.apply(role)
    namespace.kubectl(
        "create",
        "rolebinding",
        "run-trainer",
        "--role=run-trainer",
        "--serviceaccount",
        f"{namespace.name}:run-trainer",
    )
    patch = {
        "metadata": {"annotations": {"cuda-agent.io/started-at": "2099-01-01T00:00:00Z"}},
        "status": {"step": 1},
    }
    tries: list[Any] = []

    def write() -> bool:
        args = (
            "patch",
            "trainingrun",
            "run",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(patch),
        )
        tries.append(as_trainer(namespace, *args, check=False))
        return bool(tries[-1].returncode == 0)

    deadline = time.monotonic() + 30
    while not write() and time.monotonic() < deadline:  # the RoleBinding takes a moment to apply
        time.sleep(0.5)
    assert tries[-1].returncode == 0, tries[-1].stderr
    run = namespace.get("trainingrun", "run")
    assert run["status"]["step"] == 1
    assert "cuda-agent.io/started-at" not in (run["metadata"].get("annotations") or {})

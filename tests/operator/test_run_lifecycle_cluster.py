"""A TrainingRun's life on a full cluster, against the real apiserver, scheduler and kwok (16 nodes x 8
GPUs): two runs that each need 80 of the 128 GPUs (one runs, the other is Queued with the reason and
starts when the first ends), a crash-looping trainer (the run fails with the kubelet's reason, nothing
is re-created), a deadline, Events, the operator killed in the middle, its /metrics, and a SandboxPool
whose pods do not answer.

kwok plays the kubelet and runs no containers, so where a test needs a trainer to crash it writes the
driver pod's status as a kubelet would (restart count, last termination OOMKilled, exit 137).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from fixtures.cluster import KubeCluster
from operator_harness import Namespace, OperatorProcess, metric, metric_value, pool_manifest, scrape, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_run_cluster import artifacts_secret, run_manifest

from cuda_agent.localhost import free_port


def big_run(name: str, **run_policy: int) -> dict[str, Any]:
    """A run of ten 8-GPU Ray workers (80 GPUs): two of them do not fit on 128 GPUs at once."""
    manifest: dict[str, Any] = run_manifest(name=name)
    manifest["spec"]["resources"] = {"trainerGpus": 40, "rolloutGpus": 40}
    manifest["spec"]["runPolicy"] = run_policy
    return manifest


def status(ns: Namespace, name: str) -> dict[str, Any]:
    return dict((ns.get_or_none("trainingrun", name) or {}).get("status") or {})


def condition(ns: Namespace, name: str, kind: str) -> dict[str, Any]:
    return ns.condition(f"trainingrun/{name}", kind) or {}


def run_pods(ns: Namespace, name: str) -> list[str]:
    pods = ns.items("pods", "-l", f"cuda-agent.io/training-run={name}")
    return sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))


def crash_loop(ns: Namespace, pod: str, restarts: int) -> None:
    """What the kubelet writes for a container OOM-killed `restarts` times and backing off."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    image = ns.get("pod", pod)["spec"]["containers"][0]["image"]
    container = {
        "name": "trainer", "image": image, "imageID": "", "ready": False, "started": False,
        "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting container"}},
        "lastState": {
            "terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": now, "finishedAt": now}
        },
    }  # fmt: skip
    patch = {"status": {"containerStatuses": [container]}}
    ns.kubectl("patch", "pod", pod, "--subresource=status", "--type=merge", "-p", json.dumps(patch))


def run_events(ns: Namespace) -> list[tuple[str, str]]:
    """(run, reason) of every Event the operator posted on a TrainingRun, oldest first."""
    events = [e for e in ns.items("events") if e["involvedObject"]["kind"] == "TrainingRun"]
    events.sort(key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]))
    return [(e["involvedObject"]["name"], e["reason"]) for e in events]


def test_two_runs_one_cluster_queue_a_crash_loop_fails_with_its_reason_a_deadline_ends_a_run(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    port = free_port()
    operator = operator_factory("--metrics-port", str(port))
    namespace.apply(artifacts_secret())
    # An autoscaled pool whose pod never answers (kwok's pod IPs are outside --probe-network).
    namespace.apply(
        pool_manifest(
            "pool", 1, autoscaling={"minReplicas": 1, "maxReplicas": 2, "targetSessionsPerReplica": 1}
        )
    )
    namespace.apply(big_run("first", backoffLimit=1))
    wait_for(lambda: len(run_pods(namespace, "first")) >= 11, "the first run's Ray head and 10 workers")
    assert condition(namespace, "first", "Admitted")["reason"] == "GangAdmitted"

    # The second does not fit while the first holds its GPUs: Queued, with the numbers, and no pod.
    namespace.apply(big_run("second", startTimeoutSeconds=10, activeDeadlineSeconds=15))
    wait_for(lambda: status(namespace, "second").get("phase") == "Queued", "the second run to be Queued")
    admitted = condition(namespace, "second", "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "InsufficientGPU")
    assert "80 GPUs" in admitted["message"] and "starts by itself" in admitted["message"]

    # The operator dies and comes back: nothing is duplicated, the second run is still queued.
    operator.kill()
    operator.start()
    wait_for(lambda: status(namespace, "first").get("phase") == "WarmingUp", "the first run's trainer")
    assert status(namespace, "second")["phase"] == "Queued" and not run_pods(namespace, "second")
    assert len(run_pods(namespace, "first")) == 12  # head, 10 workers, driver

    # The pool's pod does not answer: its load is Unknown, not zero sessions.
    reported = wait_for(lambda: namespace.condition("sandboxpool/pool", "LoadReported"), "LoadReported")
    assert (reported["status"], reported["reason"]) == ("Unknown", "PodsNotAnswering")
    assert "activeSessions" not in namespace.get("sandboxpool", "pool")["status"]
    # Restarted while the pool does not answer: its first passes report Unknown again, never zeros.
    operator.kill()
    operator.start()
    wait_for(lambda: metric_value(port, "SandboxPool") >= 2, "the new operator's passes over the pool")
    reported = namespace.condition("sandboxpool/pool", "LoadReported")
    assert reported is not None
    assert (reported["status"], reported["reason"]) == ("Unknown", "PodsNotAnswering")
    assert "activeSessions" not in namespace.get("sandboxpool", "pool")["status"]

    # The first run's trainer is OOM-killed twice (backoffLimit 1): Failed with the kubelet's reason.
    crash_loop(namespace, "first-driver", restarts=2)
    wait_for(lambda: status(namespace, "first").get("phase") == "Failed", "the first run to fail")
    failed = condition(namespace, "first", "Failed")
    assert failed["reason"] == "OOMKilled" and "exit 137" in failed["message"]
    assert "backoffLimit=1" in failed["message"] and "log" in failed["message"]
    # Killed again right after the end was written: the new operator finds the run ended, not new.
    operator.kill()
    operator.start()
    wait_for(lambda: not run_pods(namespace, "first"), "the first run's compute to go")

    # Its GPUs free, the second run starts by itself; its deadline then ends it.
    wait_for(lambda: status(namespace, "second").get("phase") == "WarmingUp", "the second run to start")
    assert status(namespace, "second").get("startTime")
    # Restarted while the deadline runs: the deadline counts from status.startTime, not from this process.
    operator.kill()
    operator.start()
    wait_for(lambda: status(namespace, "second").get("phase") == "Failed", "the second run's deadline")
    assert condition(namespace, "second", "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: not run_pods(namespace, "second"), "the second run's compute to go")

    # An ended run creates nothing, however many passes follow (a change to a run is a pass), and a pass
    # that changes no condition posts no Event.
    before = metric_value(port, "TrainingRun")
    events_before = run_events(namespace)
    for touch in range(2):
        for name in ("first", "second"):
            namespace.kubectl("annotate", "--overwrite", "trainingrun", name, f"example.com/touch={touch}")
    wait_for(lambda: metric_value(port, "TrainingRun") >= before + 4, "passes over the ended runs")
    assert not run_pods(namespace, "first") and not run_pods(namespace, "second")
    assert status(namespace, "first")["phase"] == "Failed"
    assert run_events(namespace) == events_before

    # Events tell the story, one per condition transition (a new phase on the condition behind it), each
    # once however often the operator was restarted; the operator logged one JSON line per changing pass.
    told = run_events(namespace)
    assert told.count(("first", "OOMKilled")) == 1 and told.count(("second", "DeadlineExceeded")) == 1
    assert told.count(("second", "InsufficientGPU")) == 1  # queued once, though passed over many times
    reasons = {e["reason"]: e for e in namespace.items("events") if e["involvedObject"]["kind"] != "Pod"}
    assert {"InsufficientGPU", "WarmUpStages", "OOMKilled", "DeadlineExceeded", "PodsNotAnswering"} <= set(
        reasons
    )
    assert reasons["OOMKilled"]["type"] == "Warning" and reasons["InsufficientGPU"]["type"] == "Normal"
    assert reasons["InsufficientGPU"]["message"].startswith("phase Queued; Admitted=False: ")
    lines = [json.loads(line) for line in operator.log_text().splitlines() if line.startswith("{")]
    passes = [line for line in lines if line["logger"] == "cuda_agent.operator.reconcile"]
    assert any(p["k8s_ref"]["kind"] == "TrainingRun" and p.get("phase") == "Queued" for p in passes)
    text = scrape(port)
    assert metric(text, "cuda_agent_operator_queued_trainingruns") == 0
    assert metric(text, "workqueue_depth", name="trainingrun") is not None
    assert metric(text, "controller_runtime_max_concurrent_reconciles", controller="trainingrun") == 4
    # client-go's work-queue families from the operator's queue, and its rest client's from its own API
    # requests to this apiserver (status writes are PATCHes answered 200, Events POSTs answered 201).
    assert (metric(text, "workqueue_adds_total", name="trainingrun") or 0) >= 1
    assert (metric(text, "workqueue_work_duration_seconds_count", name="trainingrun") or 0) >= 1
    assert (metric(text, "workqueue_queue_duration_seconds_count", name="sandboxpool") or 0) >= 1
    assert metric(text, "workqueue_longest_running_processor_seconds", name="trainingrun") is not None
    server = yaml.safe_load(namespace.cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host = urlsplit(server).netloc
    served = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }  # parsed: the exposition orders a sample's labels by name, not as declared
    assert served[("rest_client_requests_total", (("code", "200"), ("host", host), ("method", "PATCH")))] >= 1
    assert served[("rest_client_requests_total", (("code", "201"), ("host", host), ("method", "POST")))] >= 1
    assert served[("rest_client_request_duration_seconds_count", (("host", host), ("verb", "PATCH")))] >= 1
    # Its own families only: the trainer's (default registry of any process importing cuda_agent.telemetry)
    # are served by the trainer, never here as zeros.
    assert "cuda_agent_trainer_" not in text and "cuda_agent_episode" not in text


POD_GROUP_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
    "spec": {
        "group": "scheduling.x-k8s.io",
        "names": {
            "kind": "PodGroup",
            "listKind": "PodGroupList",
            "plural": "podgroups",
            "singular": "podgroup",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def podgroup_crd(kube_cluster: KubeCluster) -> Iterator[None]:
    """scheduler-plugins' PodGroup API, without its scheduler: the test binds the pods as it would."""
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(POD_GROUP_CRD))
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/podgroups.scheduling.x-k8s.io"
    )
    yield
    kube_cluster.kubectl("delete", "crd", "podgroups.scheduling.x-k8s.io", "--wait=true", "--timeout=60s")


def test_a_run_is_handed_to_coscheduling_when_podgroups_are_served(
    podgroup_crd: None, namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator_factory("--gang-scheduler-name", "coscheduler")
    namespace.apply(pool_manifest("pool", 0))
    namespace.apply(artifacts_secret())
    namespace.apply(run_manifest())  # 4 + 4 GPUs: a head and one 8-GPU worker
    group = wait_for(lambda: namespace.get_or_none("podgroup", "run-ray"), "the run's PodGroup")
    assert group["spec"]["minMember"] == 2 and group["spec"]["minResources"] == {"nvidia.com/gpu": "8"}
    wait_for(lambda: len(run_pods(namespace, "run")) == 2, "the Ray head and worker")
    # No scheduler named "coscheduler" runs here: the pods wait, and the run says for what.
    wait_for(lambda: status(namespace, "run").get("phase") == "Queued", "Queued")
    assert condition(namespace, "run", "Admitted")["reason"] == "WaitingForGangScheduler"
    for name in run_pods(namespace, "run"):
        pod = namespace.get("pod", name)
        assert pod["spec"]["schedulerName"] == "coscheduler"
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "run-ray"

    # Stand in for coscheduling: bind the whole gang at once. kwok runs the pods; the run starts.
    node = namespace.cluster.nodes[0]
    for name in run_pods(namespace, "run"):
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        namespace.kubectl("create", "-f", "-", input=json.dumps(binding))
    wait_for(
        lambda: condition(namespace, "run", "Admitted").get("reason") == "GangScheduled", "GangScheduled"
    )
    assert status(namespace, "run").get("startTime")

"""SandboxPool children built from the spec: pod hardening, GPU placement, network policy, hashes."""

from __future__ import annotations

from typing import Any

import pytest

from cuda_agent.api.pool_server import server_config
from cuda_agent.api.sandbox import SANDBOX_METRICS_PORT, SANDBOX_PORT
from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.operator import labels as lb
from cuda_agent.operator.pool_children import (
    PoolIdentity,
    headless_service,
    judge_configmap,
    network_policy,
    statefulset,
    trace_export,
)

POOL = PoolIdentity(name="pool", namespace="team", uid="uid-1")
RESTRICTED_VOLUMES = {"configMap", "emptyDir", "projected", "secret", "downwardAPI", "persistentVolumeClaim"}


def spec(**overrides: Any) -> SandboxPoolSpec:
    return SandboxPoolSpec.model_validate({"image": "registry/sandbox:1", **overrides})


def pod_spec(pool_spec: SandboxPoolSpec) -> dict[str, Any]:
    manifest = statefulset(POOL, pool_spec, 3, ["judge.py"], "abc")
    result: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return result


def test_pod_meets_the_restricted_pod_security_profile() -> None:
    pod = pod_spec(spec())
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {next(iter(set(v) - {"name"})) for v in pod["volumes"]} <= RESTRICTED_VOLUMES
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
        assert context["readOnlyRootFilesystem"] is True
        assert container["readinessProbe"]["httpGet"]["path"] == "/v1/status"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["automountServiceAccountToken"] is False


def test_gpu_request_node_selector_and_tolerations_come_from_spec_gpu() -> None:
    pod = pod_spec(spec(gpu={"resourceName": "nvidia.com/gpu", "count": 2, "product": "NVIDIA-H200"}))
    resources = pod["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "2" == resources["requests"]["nvidia.com/gpu"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_cpu_only_pool_requests_no_gpu() -> None:
    pod = pod_spec(spec(gpu={"count": 0}))
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]
    assert "tolerations" not in pod and "nodeSelector" not in pod


def test_localhost_seccomp_runtime_class_and_limits() -> None:
    pod = pod_spec(
        spec(
            security={
                "seccompProfile": {"type": "Localhost", "localhostProfile": "cuda-agent/sandbox.json"},
                "runtimeClassName": "gvisor",
            },
            limits={
                "memory": "16Gi",
                "workspaceSize": "1Gi",
                "buildTimeoutSeconds": 100,
                "runTimeoutSeconds": 50,
            },
        )
    )
    expected = {"type": "Localhost", "localhostProfile": "cuda-agent/sandbox.json"}
    assert pod["securityContext"]["seccompProfile"] == expected
    assert pod["containers"][0]["securityContext"]["seccompProfile"] == expected
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "16Gi"
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    assert state["emptyDir"]["sizeLimit"] == f"{8 * 1024 + 2048}Mi"  # 8 sessions of 1 GiB + build caches
    assert pod["terminationGracePeriodSeconds"] == 180


def test_judge_files_are_mounted_read_only_with_their_digests() -> None:
    configmap = judge_configmap(POOL, spec(), {"judge.py": "print(1)\n", "lib/timing.py": "x = 1\n"})
    assert set(configmap["data"]) == {"judge.py", "lib__timing.py", "MANIFEST.sha256", "sandbox.yaml"}
    assert "  lib/timing.py" in configmap["data"]["MANIFEST.sha256"]
    pod = statefulset(POOL, spec(), 1, ["judge.py", "lib/timing.py"], "abc")["spec"]["template"]["spec"]
    judge = next(v for v in pod["volumes"] if v["name"] == "judge")
    assert {"key": "lib__timing.py", "path": "lib/timing.py"} in judge["configMap"]["items"]
    assert {"key": "sandbox.yaml", "path": "sandbox.yaml"} not in judge["configMap"]["items"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "judge")
    assert mount["readOnly"] is True


def test_server_config_is_one_the_sandbox_server_accepts() -> None:
    """The pods run `cuda-agent sandbox serve --config`: the file must validate as the server's own model."""
    from cuda_agent.sandbox.server.config import SandboxServerConfig

    pool_spec = spec(
        autoscaling={"minReplicas": 1, "maxReplicas": 4, "targetSessionsPerReplica": 3},
        limits={"workspaceSize": "512Mi", "pids": 300, "buildTimeoutSeconds": 200, "runTimeoutSeconds": 60},
    )
    config = SandboxServerConfig.model_validate(server_config(pool_spec))
    assert (config.port, config.max_sessions, config.workspace_quota_mib) == (SANDBOX_PORT, 6, 512)
    assert config.agent_limits.processes == 300 and config.judge_timeout_s == 320
    assert str(config.judge_dir) == "/opt/cuda-agent/judge"
    assert str(config.judge_seed_dir) == "/opt/cuda-agent/judge-seed"  # built into the sandbox image
    container = pod_spec(pool_spec)["containers"][0]
    assert container["command"][-1] == "/etc/cuda-agent/sandbox/sandbox.yaml"
    assert container["ports"][0]["containerPort"] == SANDBOX_PORT


def test_statefulset_parallel_with_stable_names_and_pool_selector() -> None:
    manifest = statefulset(POOL, spec(), 7, [], "abc")
    assert manifest["spec"]["replicas"] == 7
    assert manifest["spec"]["podManagementPolicy"] == "Parallel"
    assert manifest["spec"]["serviceName"] == headless_service(POOL)["metadata"]["name"] == "pool"
    selector = manifest["spec"]["selector"]["matchLabels"]
    assert selector.items() <= manifest["spec"]["template"]["metadata"]["labels"].items()
    owner = manifest["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("SandboxPool", "uid-1", True)


def test_network_policy_denies_egress_and_admits_only_trainers_and_operator() -> None:
    policy = network_policy(POOL)["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["egress"] == []
    sources = policy["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": {lb.SANDBOX_CLIENT_LABEL: "pool"}}} in sources
    assert len(policy["ingress"]) == 1 and len(sources) == 2


def test_prometheus_reaches_only_the_metrics_port_and_only_when_its_labels_are_given() -> None:
    scraper = (("app.kubernetes.io/name", "prometheus"),)
    ingress = network_policy(POOL, None, scraper)["spec"]["ingress"]
    assert ingress[1] == {
        "from": [
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": SANDBOX_METRICS_PORT}],
    }
    assert ingress[0]["ports"] == [{"protocol": "TCP", "port": SANDBOX_PORT}]  # the API port: unchanged
    container = pod_spec(spec())["containers"][0]
    assert {"name": "metrics", "containerPort": SANDBOX_METRICS_PORT, "protocol": "TCP"} in container["ports"]
    assert server_config(spec())["metrics_port"] == SANDBOX_METRICS_PORT


COLLECTOR = (("app.kubernetes.io/name", "cuda-agent-otel-collector"),)


def test_trace_export_is_opt_in_and_needs_the_operators_endpoint_and_collector() -> None:
    asking = spec(telemetry={"exportTraces": True})
    assert trace_export(spec(), "http://collector.obs:4318", COLLECTOR) is None
    assert trace_export(asking, None, COLLECTOR) is None
    assert trace_export(asking, "http://collector.obs:4318", ()) is None  # no pods to open egress to
    assert "env" not in pod_spec(asking)["containers"][0]


def test_a_pool_exporting_traces_reaches_its_collector_and_dns_only() -> None:
    export = trace_export(spec(telemetry={"exportTraces": True}), "http://collector.obs:4318", COLLECTOR)
    assert export is not None
    egress = network_policy(POOL, export)["spec"]["egress"]
    assert egress[0] == {
        "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": dict(COLLECTOR)}}],
        "ports": [{"protocol": "TCP", "port": 4318}],
    }
    assert [p["port"] for p in egress[1]["ports"]] == [53, 53]
    assert egress[1]["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert len(egress) == 2  # nothing else: no ipBlock, no other port
    container = statefulset(POOL, spec(), 1, [], "abc", export)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.obs:4318"
    assert env["CUDA_AGENT_POOL_NAME"] == "pool"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}


@pytest.mark.parametrize("replicas", [1, 2])
def test_hash_changes_with_content_only(replicas: int) -> None:
    first = statefulset(POOL, spec(), replicas, [], "abc")["metadata"]["annotations"][lb.SPEC_HASH]
    again = statefulset(POOL, spec(), replicas, [], "abc")["metadata"]["annotations"][lb.SPEC_HASH]
    other = statefulset(POOL, spec(), replicas + 1, [], "abc")["metadata"]["annotations"][lb.SPEC_HASH]
    assert first == again != other

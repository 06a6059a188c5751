"""The Helm chart rendered by the real `helm` (no cluster): lint, the values schema, and that what it renders
agrees with the code it deploys (CRDs, seccomp profile, image names, operator flags, artifacts Secret keys,
SandboxPool specs), each checked against that code's own parser or file rather than a copy."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from install_helpers import CHART, EXAMPLE_KEYS, GPU_EXAMPLE, REPO, Helm, find, wait_for

from cuda_agent.api.run_contract import TRAINER_METRICS_PORT
from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.operator import labels
from cuda_agent.operator.cli import parse_args
from cuda_agent.operator.config import OperatorConfig
from cuda_agent.operator.run_children import RunContext, driver_pod, ray_pods
from cuda_agent.storage.config import StorageConfig

PROFILE = REPO / "sandbox_image" / "seccomp" / "sandbox.json"
USERNS_PROFILE = PROFILE.with_name("sandbox-userns.json")
SPO_API = "security-profiles-operator.x-k8s.io/v1beta1/SeccompProfile"
EVERYTHING = ("--set", "minio.enabled=true", "--set", "telemetry.collector.enabled=true")


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = find(objects, "Deployment", "-operator")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    "values",
    [(), EVERYTHING, ("-f", str(GPU_EXAMPLE), *EXAMPLE_KEYS)],
    ids=["defaults", "minio-and-collector", "gpu-cluster-example"],
)
def test_lint_is_clean(helm: Helm, values: tuple[str, ...]) -> None:
    proc = helm("lint", "--strict", str(CHART), *values, check=False)
    findings = [line for line in proc.stdout.splitlines() if line.startswith(("[WARNING]", "[ERROR]"))]
    assert proc.returncode == 0 and not findings, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("values", "field"),
    [
        (
            ("--set", "operator.leaderElection.retryPeriodSeconds=0"),
            "/operator/leaderElection/retryPeriodSeconds",
        ),
        (("--set", "operator.workerz=2"), "additional properties 'workerz'"),
        (("--set", "seccomp.mode=apparmor"), "/seccomp/mode"),
        (("--set", "metrics.port=70000"), "/metrics/port"),
        (("--set", "images.operator.digest=sha256:abc"), "/images/operator/digest"),
        (("--set", "artifacts.external.endpoint=https://s3.example.com/b"), "/artifacts/external/endpoint"),
        (("--set", "artifacts.external.endpoint=s3.example.com"), "/artifacts/external/accessKey"),
        (("--set", "operator.watch.namespaces={team-a}"), "/operator/watch/namespaces"),
        (("--set", "operator.allowedTrainerImages={Bad Image}"), "/operator/allowedTrainerImages/0"),
        (
            ("--set", "sandboxPools[0].name=Bad_Name", "--set", "sandboxPools[0].spec={}"),
            "/sandboxPools/0/name",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_values_fail_naming_the_field(helm: Helm, values: tuple[str, ...], field: str) -> None:
    proc = helm("template", "rel", str(CHART), *values, check=False)
    assert proc.returncode != 0, f"{values} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert field in proc.stderr, proc.stderr


def test_replicas_without_leader_election_fail_saying_leader_election_must_be_on(helm: Helm) -> None:
    """A template `fail`, not a schema rule: JSON schema could only say "value must be 1". (`helm lint`
    does not stop at a template's `fail`; install, upgrade and template do.)"""
    values = ("--set", "operator.replicas=2", "--set", "operator.leaderElection.enabled=false")
    proc = helm("template", "rel", str(CHART), *values, check=False)
    assert proc.returncode != 0, "two operators without leader election were accepted"
    assert (
        "operator.replicas is 2: more than one operator needs leader election on "
        "(operator.leaderElection.enabled=true, the default)"
    ) in proc.stderr
    assert helm.template("--set", "operator.replicas=2")  # with leader election (the default): fine


def test_chart_crds_are_the_repository_crds(helm: Helm) -> None:
    # charts/cuda-agent/crds is `make crds`'s copy of crds/ (test_chart_files.py: byte for byte); this
    # checks what Helm itself reads from the chart.
    shown = [doc for doc in yaml.safe_load_all(helm("show", "crds", str(CHART)).stdout) if doc]
    generated = [yaml.safe_load(path.read_text()) for path in sorted((REPO / "crds").glob("*.yaml"))]
    key = lambda crd: crd["metadata"]["name"]  # noqa: E731
    assert sorted(shown, key=key) == sorted(generated, key=key)


def test_seccomp_daemonset_installs_the_sandbox_profile(helm: Helm) -> None:
    objects = helm.template()
    config_map = find(objects, "ConfigMap", "-seccomp")
    assert json.loads(config_map["data"]["sandbox.json"]) == json.loads(PROFILE.read_text())
    assert json.loads(config_map["data"]["sandbox-userns.json"]) == json.loads(USERNS_PROFILE.read_text())
    daemonset = find(objects, "DaemonSet", "-seccomp")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (host,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert host["hostPath"]["path"] == "/var/lib/kubelet/seccomp"
    security = pod["containers"][0]["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert not any(o["kind"] == "SeccompProfile" for o in objects)


def test_security_profiles_operator_gets_the_same_profile_when_served(helm: Helm) -> None:
    pool_values = ("--set", "sandboxPools[0].name=pool", "--set", "sandboxPools[0].spec.replicas=1")
    objects = helm.template("--api-versions", SPO_API, *pool_values)
    assert not [
        o for o in objects if o["kind"] in ("DaemonSet", "ConfigMap") and "seccomp" in o["metadata"]["name"]
    ]
    for suffix, path in (("-sandbox", PROFILE), ("-sandbox-userns", USERNS_PROFILE)):
        spec = find(objects, "SeccompProfile", suffix)["spec"]
        profile = json.loads(path.read_text())
        assert spec["defaultAction"] == profile["defaultAction"]
        assert profile["defaultErrnoRet"] == 1  # SPO has no defaultErrnoRet; EPERM is its default
        assert spec["architectures"] == profile["architectures"]
        expected = [
            {key: value for key, value in rule.items() if key != "comment"} for rule in profile["syscalls"]
        ]
        assert spec["syscalls"] == expected
    pool = find(objects, "SandboxPool", "pool")
    assert pool["spec"]["security"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "operator/cuda-agent/rel-cuda-agent-sandbox.json",
    }


def test_seccomp_installer_script_writes_the_profile_and_stops_on_sigterm(helm: Helm, tmp_path: Path) -> None:
    """The DaemonSet's own shell script, run here with its two paths pointed at a temp dir."""
    container = find(helm.template(), "DaemonSet", "-seccomp")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    source, target_dir = tmp_path / "profile", tmp_path / "host" / "seccomp" / "cuda-agent"
    source.mkdir()
    for profile in (PROFILE, USERNS_PROFILE):
        (source / profile.name).write_text(profile.read_text())
    (target_dir / "sandbox.json").parent.mkdir(parents=True)
    (target_dir / "sandbox.json").write_text("{}")  # an old profile is replaced
    proc = subprocess.Popen(
        container["command"],
        env={"PATH": os.environ["PATH"], "PROFILE_SOURCE_DIR": str(source), "PROFILE_DIR": str(target_dir)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: whatever it started goes with it below
    )
    try:
        assert proc.stdout is not None
        installed = [proc.stdout.readline().strip() for _ in range(2)]
        names = ["sandbox-userns.json", "sandbox.json"]
        assert installed == [f"installed {target_dir}/{name}" for name in names]
        for profile in (PROFILE, USERNS_PROFILE):
            assert (target_dir / profile.name).read_text() == profile.read_text()
        assert sorted(p.name for p in target_dir.iterdir()) == names
        probe = [
            arg.replace(env["PROFILE_SOURCE_DIR"], str(source)).replace(env["PROFILE_DIR"], str(target_dir))
            for arg in container["readinessProbe"]["exec"]["command"]
        ]
        assert subprocess.run(probe, check=False).returncode == 0
        (target_dir / "sandbox-userns.json").write_text("{}")  # a profile changed on the node: not ready
        assert subprocess.run(probe, check=False).returncode == 1
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: proc.poll() is not None, "the installer to exit on SIGTERM", timeout=10)
        assert proc.returncode == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_servicemonitor_only_when_the_prometheus_operator_is_served(helm: Helm) -> None:
    assert not any(o["kind"] == "ServiceMonitor" for o in helm.template())
    objects = helm.template("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")
    monitor, service = find(objects, "ServiceMonitor"), find(objects, "Service", "-operator-metrics")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"


def test_sandbox_pods_are_scraped_on_their_metrics_port_by_the_pods_named_in_values(helm: Helm) -> None:
    assert not any(o["kind"] == "PodMonitor" for o in helm.template())
    objects = helm.template(
        "--api-versions",
        "monitoring.coreos.com/v1/PodMonitor",
        "--set",
        "metrics.sandboxScraperPodLabels.app\\.kubernetes\\.io/name=prometheus",
    )
    monitor = find(objects, "PodMonitor", "-sandbox")
    selector = monitor["spec"]["selector"]["matchLabels"]
    # The labels the operator gives sandbox pods, and their metrics-only port's name.
    pod_labels = labels.child_labels(labels.POOL_LABEL, "pool", labels.COMPONENT_SANDBOX)
    assert selector.items() <= pod_labels.items() and monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    config = parse_args(operator_container(objects)["args"])
    assert config.metrics_scraper_labels == (("app.kubernetes.io/name", "prometheus"),)


def test_trainer_driver_pods_are_scraped_on_the_port_the_operator_gives_them(helm: Helm) -> None:
    """The PodMonitor selects what run_children.driver_pod renders (its labels, its port `metrics`), and
    metrics.trainerPodMonitor.enabled switches it off."""
    objects = helm.template("--api-versions", "monitoring.coreos.com/v1/PodMonitor")
    monitor = find(objects, "PodMonitor", "-trainer")
    run = RunContext("run", "team", "uid", "trainer:1", "artifacts", "s3://b/p", None, None)
    spec = TrainingRunSpec.model_validate(
        {
            "model": {"base": "s3://models/qwen"},
            "dataset": {"uri": "s3://data/ops"},
            "sandboxPoolRef": {"name": "pool"},
        }
    )
    driver = driver_pod(run, spec, kuberay=False)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= driver["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    ports = {p.get("name"): p["containerPort"] for p in driver["spec"]["containers"][0]["ports"]}
    assert endpoint["port"] == "metrics" and ports["metrics"] == TRAINER_METRICS_PORT
    ray_head = ray_pods(run, spec)[0]
    assert not selector.items() <= ray_head["metadata"]["labels"].items()  # Ray's pods serve none of it
    off = helm.template(
        "--api-versions",
        "monitoring.coreos.com/v1/PodMonitor",
        "--set",
        "metrics.trainerPodMonitor.enabled=false",
    )
    monitors = [o["metadata"]["name"] for o in off if o["kind"] == "PodMonitor"]
    assert len(monitors) == 1 and monitors[0].endswith("-sandbox")


def test_leader_election_is_a_lease_in_the_release_namespace_and_standalone_recreates(helm: Helm) -> None:
    """By default the operator elects a leader through one Lease of its own namespace (its Role grants
    create, and get/update of that name only), so replicas may exceed 1 and updates roll; switched off,
    the operator runs standalone and the Deployment recreates (the schema then holds replicas at 1)."""
    objects = helm.template("--set", "operator.replicas=2")
    deployment = find(objects, "Deployment", "-operator")
    assert deployment["spec"]["replicas"] == 2
    config = parse_args(operator_container(objects)["args"])
    assert config.leader_election is not None
    election = config.leader_election
    assert election.namespace == "cuda-agent" and election.lease_name == "rel-cuda-agent-operator"
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (15, 10, 2)
    env = {e["name"]: e for e in operator_container(objects)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    role = find(objects, "Role", "-operator-leader-election")
    assert role["metadata"]["namespace"] == "cuda-agent"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["rel-cuda-agent-operator"],
            "verbs": ["get", "update"],
        },
    ]
    standalone = helm.template("--set", "operator.leaderElection.enabled=false")
    assert find(standalone, "Deployment", "-operator")["spec"]["strategy"] == {"type": "Recreate"}
    assert parse_args(operator_container(standalone)["args"]).leader_election is None
    assert not [o for o in standalone if o["metadata"]["name"].endswith("-leader-election")]


def test_operator_deployment_is_restricted_and_its_args_parse(helm: Helm) -> None:
    objects = helm.template(*EVERYTHING)
    deployment = find(objects, "Deployment", "-operator")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    pod = deployment["spec"]["template"]["spec"]
    # Every SandboxPool's NetworkPolicy admits the operator by this label.
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/name"] == labels.OPERATOR_NAME
    container = operator_container(objects)
    assert container["command"] == ["cuda-agent", "operator"]
    config = parse_args(container["args"])  # the operator's own parser and settings model
    assert config.namespaces == () and config.liveness_endpoint == "http://0.0.0.0:8080/healthz"
    assert config.metrics_port == 9090
    assert config.trainer_image == OperatorConfig().trainer_image == "ghcr.io/cuda-agent/trainer:0.1.0"
    assert config.otel_endpoint == "http://rel-cuda-agent-otel-collector.cuda-agent.svc:4318"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"healthz": 8080, "metrics": 9090}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    for name in ("-operator", "-minio", "-otel-collector"):
        template = find(objects, "Deployment", name)["spec"]["template"]["spec"]
        assert template["securityContext"]["runAsNonRoot"] is True
        for c in template["containers"]:
            assert c["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "runAsNonRoot": True,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            }, name
    assert pod["serviceAccountName"] == find(objects, "ServiceAccount")["metadata"]["name"]


def test_images_have_one_home(helm: Helm) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["images"]
    trainer = f"{values['trainer']['repository']}:{values['trainer']['tag']}"
    assert trainer == OperatorConfig().trainer_image  # the operator's default when no flag is given
    objects = helm.template("--set", "images.trainer.digest=sha256:" + "a" * 64)
    config = parse_args(operator_container(objects)["args"])
    assert config.trainer_image == f"{values['trainer']['repository']}@sha256:{'a' * 64}"


def test_namespaced_watch_gets_roles_only_where_it_watches(helm: Helm) -> None:
    objects = helm.template(
        "--set", "operator.watch.allNamespaces=false", "--set", "operator.watch.namespaces={team-a,team-b}",
    )  # fmt: skip
    config = parse_args(operator_container(objects)["args"])
    assert config.namespaces == ("team-a", "team-b")
    # The operator's rules; the release namespace's Lease Role is test_leader_election_...'s.
    watched = [o for o in objects if not o["metadata"]["name"].endswith("-leader-election")]
    roles = sorted(o["metadata"]["namespace"] for o in watched if o["kind"] == "Role")
    bindings = sorted(o["metadata"]["namespace"] for o in watched if o["kind"] == "RoleBinding")
    assert roles == bindings == ["team-a", "team-b"]
    (cluster_role,) = [
        o for o in objects if o["kind"] == "ClusterRole" and "-operator" in o["metadata"]["name"]
    ]
    # Cluster-wide, the operator only reads: CRDs, and nodes and pods for gang admission.
    assert {verb for rule in cluster_role["rules"] for verb in rule["verbs"]} <= {"get", "list", "watch"}
    role = next(o for o in watched if o["kind"] == "Role")
    (secrets,) = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert secrets == {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["cuda-agent-artifacts"],
                       "verbs": ["get"]}  # fmt: skip
    cluster = helm.template()
    assert {o["metadata"]["name"] for o in cluster if o["kind"] == "ClusterRole"} == {
        "rel-cuda-agent-operator",
        "rel-cuda-agent-operator-cluster",
        "rel-cuda-agent-edit",  # users' aggregated roles (test_users_get_the_two_kinds_...)
        "rel-cuda-agent-view",
    }
    assert [o["metadata"]["name"] for o in cluster if o["kind"] == "Role"] == [
        "rel-cuda-agent-operator-leader-election"  # the Lease only
    ]


def test_users_get_the_two_kinds_through_the_default_edit_and_view_roles(helm: Helm) -> None:
    """Aggregated into admin/edit (write, scale; no status) and view (read); switched off by a value.
    tests/install/test_install.py checks `kubectl auth can-i` through them on a real apiserver."""
    roles = {o["metadata"]["name"]: o for o in helm.template() if o["kind"] == "ClusterRole"}
    edit, view = roles["rel-cuda-agent-edit"], roles["rel-cuda-agent-view"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in edit["metadata"]["labels"] if k.startswith(aggregate)} == {
        aggregate + "admin",
        aggregate + "edit",
    }
    assert {k for k in view["metadata"]["labels"] if k.startswith(aggregate)} == {aggregate + "view"}
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    for rule in edit["rules"]:
        assert rule["apiGroups"] == ["cuda-agent.io"]
        if any(r.endswith("/status") for r in rule["resources"]):
            assert rule["verbs"] == ["get"]  # status is the operator's and the trainers' to write
    assert all(not writes & set(rule["verbs"]) for rule in view["rules"])
    off = helm.template("--set", "rbac.aggregateToDefaultRoles=false")
    assert not [
        o for o in off if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith(("-edit", "-view"))
    ]


def test_artifacts_secret_parses_with_the_operators_storage_config(helm: Helm) -> None:
    minio = helm.template(
        "--set", "minio.enabled=true", "--set", "artifacts.namespaces={team-a}",
        "--set", "artifacts.tenantCredentials=false",
    )  # fmt: skip
    secrets = [o for o in minio if o["kind"] == "Secret" and o["metadata"]["name"] == "cuda-agent-artifacts"]
    assert sorted(s["metadata"]["namespace"] for s in secrets) == ["cuda-agent", "team-a"]
    config = StorageConfig.from_secret(secrets[0])
    assert config.endpoint_url == "http://rel-cuda-agent-minio.cuda-agent.svc:9000"
    root = find(minio, "Secret", "-minio")["stringData"]
    assert config.access_key == root["MINIO_ROOT_USER"]  # one tenant: the root keys everywhere
    assert config.secret_key is not None
    assert config.secret_key.get_secret_value() == root["MINIO_ROOT_PASSWORD"]
    assert not [o for o in minio if o["kind"] == "Job"]

    external = helm.template(
        "--set", "artifacts.external.endpoint=https://s3.us-east-1.amazonaws.com",
        "--set", "artifacts.external.accessKey=AKIA", "--set", "artifacts.external.secretKey=s3cr3t",
        "--set", "artifacts.external.region=us-east-1",
    )  # fmt: skip
    config = StorageConfig.from_secret(find(external, "Secret", "artifacts"))
    assert (config.endpoint_url, config.access_key, config.region) == (
        "https://s3.us-east-1.amazonaws.com",
        "AKIA",
        "us-east-1",
    )
    # Nothing to put in it: no Secret (NOTES.txt says how to create one).
    assert not any(o["kind"] == "Secret" for o in helm.template())


def test_each_namespace_gets_minio_keys_of_its_own_scoped_by_the_tenants_job(helm: Helm) -> None:
    """The default with the bundled MinIO: no namespace's Secret holds the root keys; each holds a user
    of its own, which the Job (the operator image's storage_tenants, checked against a real MinIO in
    tests/operator/test_storage_tenants.py) creates with a policy for s3://<bucket>/<namespace>/ only."""
    objects = helm.template(
        "--set", "minio.enabled=true", "--set", "artifacts.namespaces={team-a,team-b}",
        "--set", "artifacts.bucket=team-artifacts",
    )  # fmt: skip
    root = find(objects, "Secret", "-minio")["stringData"]
    tenants = json.loads(find(objects, "Secret", "-minio-tenants")["stringData"]["tenants.json"])
    assert set(tenants) == {"cuda-agent", "team-a", "team-b"}
    secrets = {
        o["metadata"]["namespace"]: StorageConfig.from_secret(o)
        for o in objects
        if o["kind"] == "Secret" and o["metadata"]["name"] == "cuda-agent-artifacts"
    }
    assert set(secrets) == set(tenants)
    for namespace, config in secrets.items():
        assert config.endpoint_url == "http://rel-cuda-agent-minio.cuda-agent.svc:9000"
        assert config.access_key == tenants[namespace]["accessKey"] == f"cuda-agent-{namespace}"
        assert config.secret_key is not None
        secret = config.secret_key.get_secret_value()
        assert secret == tenants[namespace]["secretKey"] and len(secret) == 40
        assert secret != root["MINIO_ROOT_PASSWORD"] and config.access_key != root["MINIO_ROOT_USER"]
    assert len({tenant["secretKey"] for tenant in tenants.values()}) == 3

    from cuda_agent.operator.storage_tenants import read_tenants

    job = find(objects, "Job", "")
    assert job["metadata"]["name"].startswith("rel-cuda-agent-minio-tenants-")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "cuda_agent.operator.storage_tenants"]
    assert container["args"] == [
        "--endpoint=http://rel-cuda-agent-minio.cuda-agent.svc:9000",
        "--bucket=team-artifacts",
        "--tenants=/etc/cuda-agent/tenants/tenants.json",
    ]
    assert container["envFrom"] == [{"secretRef": {"name": "rel-cuda-agent-minio"}}]  # the root keys
    assert (
        container["image"]
        == find(objects, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tenants")
    volume = next(v for v in pod["volumes"] if v["name"] == "tenants")
    assert mount["mountPath"] == "/etc/cuda-agent/tenants" and mount["readOnly"] is True
    assert volume["secret"]["secretName"] == "rel-cuda-agent-minio-tenants"
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tenants-{os.getpid()}.json"
    path.write_text(json.dumps(tenants))
    try:
        assert set(read_tenants(path)) == set(tenants)  # what the Job will read parses
    finally:
        path.unlink()
    # Another list of namespaces: another Job (a Job's pod template cannot change).
    other = helm.template("--set", "minio.enabled=true", "--set", "artifacts.namespaces={team-c}")
    assert find(other, "Job", "")["metadata"]["name"] != job["metadata"]["name"]


def test_a_run_may_pick_only_the_trainer_images_the_admin_allows(helm: Helm) -> None:
    assert parse_args(operator_container(helm.template())["args"]).allowed_trainer_images == ()
    allowed = "registry.example/team/trainer:2"
    objects = helm.template("--set", f"operator.allowedTrainerImages={{{allowed}}}")
    assert parse_args(operator_container(objects)["args"]).allowed_trainer_images == (allowed,)


def test_sandbox_pools_from_values_are_valid_specs(helm: Helm) -> None:
    objects = helm.template("-f", str(GPU_EXAMPLE), *EXAMPLE_KEYS)
    pools = {o["metadata"]["name"]: o for o in objects if o["kind"] == "SandboxPool"}
    assert set(pools) == {"h200-sandboxes", "h100-sandboxes", "h20-sandboxes"}
    specs = {name: SandboxPoolSpec.model_validate(pool["spec"]) for name, pool in pools.items()}
    h200 = specs["h200-sandboxes"]
    assert h200.autoscaling is not None and h200.autoscaling.max_replicas * h200.gpu.count == 128
    products = {spec.gpu.product for spec in specs.values()}
    assert products == {"NVIDIA-H200", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H20"}
    for spec in specs.values():
        assert spec.image == "ghcr.io/cuda-agent/sandbox:0.1.0"
        assert spec.security.seccomp_profile.localhost_profile == "cuda-agent/sandbox.json"
    # A pool requiring user namespaces gets the profile variant that permits them.
    required = "sandboxPools[0].spec.security.userNamespaces=Required"
    userns = ("--set", "sandboxPools[0].name=u", "--set", required)
    spec = SandboxPoolSpec.model_validate(find(helm.template(*userns), "SandboxPool")["spec"])
    assert spec.security.seccomp_profile.localhost_profile == "cuda-agent/sandbox-userns.json"
    # A pool that names its own profile keeps it as written.
    own = "sandboxPools[0].spec.security.seccompProfile.type=RuntimeDefault"
    objects = helm.template("--set", "sandboxPools[0].name=p", "--set", own)
    spec = SandboxPoolSpec.model_validate(find(objects, "SandboxPool")["spec"])
    assert spec.security.seccomp_profile.type == "RuntimeDefault"
    assert spec.security.seccomp_profile.localhost_profile is None


def test_minio_credentials_are_generated_once_per_render(helm: Helm) -> None:
    # Generated at install; kept across upgrades by the chart's lookup (tests/install/test_install.py).
    first, second = (find(helm.template("--set", "minio.enabled=true"), "Secret", "-minio") for _ in range(2))
    assert len(first["stringData"]["MINIO_ROOT_PASSWORD"]) == 40
    assert first["stringData"]["MINIO_ROOT_PASSWORD"] != second["stringData"]["MINIO_ROOT_PASSWORD"]

"""`cuda-agent operator` argument handling (no cluster): scope, validation errors that name the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.operator.cli import main, parse_args
from cuda_agent.operator.handlers import build_registry


def test_namespaces_and_settings_are_parsed() -> None:
    config = parse_args(["-n", "a", "-n", "b", "--sync-period", "2", "--probe-network", "127.0.0.0/8"])
    assert config.namespaces == ("a", "b")
    assert config.sync_period == 2
    assert config.probe_networks == ("127.0.0.0/8",)
    assert parse_args([]).namespaces == ()  # cluster-wide


def test_namespace_and_all_namespaces_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["-n", "a", "--all-namespaces"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_bad_network_is_reported_by_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--probe-network", "127.0.0.300/8"])
    assert "--probe-network '127.0.0.300/8'" in capsys.readouterr().err


def test_a_missing_kubeconfig_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kubeconfig", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such file" in capsys.readouterr().err


def test_registry_watches_owners_and_children_without_finalizer_handlers() -> None:
    registry = build_registry()
    # Daemons, timers and deletion handlers would make Kopf put finalizers on pools and runs.
    assert not list(registry._spawning.get_all_handlers())
    assert not list(registry._changing.get_all_handlers())
    assert {h.id for h in registry._indexing.get_all_handlers()} == {"owners", "pods", "children"}


def test_local_executor_settings_are_parsed(tmp_path: Path) -> None:
    config = parse_args(
        [
            "--executor", "local", "--run-dir", str(tmp_path), "--pvc-root", str(tmp_path / "pvc"),
            "--trainer-command", "python 'my trainer.py' -f {run_yaml}", "--restart-backoff", "0.5",
        ]
    )  # fmt: skip
    assert (config.executor, config.run_dir, config.pvc_root) == ("local", tmp_path, tmp_path / "pvc")
    assert config.trainer_command == ("python", "my trainer.py", "-f", "{run_yaml}")
    assert config.restart_backoff == 0.5
    assert parse_args([]).executor == "cluster"


def test_an_unknown_executor_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--executor", "kubelet"])
    assert "--executor" in capsys.readouterr().err


def test_collector_labels_are_parsed_and_a_malformed_one_names_its_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = parse_args(["--otel-collector-label", "app=otel", "--otel-collector-label", "tier=obs"])
    assert config.otel_collector_labels == (("app", "otel"), ("tier", "obs"))
    with pytest.raises(SystemExit):
        parse_args(["--otel-collector-label", "app"])
    assert "--otel-collector-label 'app': expected KEY=VALUE" in capsys.readouterr().err


def test_leader_election_takes_the_pods_name_and_namespace_from_the_downward_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAME", "cuda-agent-operator-7d9f-abcde")
    monkeypatch.setenv("POD_NAMESPACE", "cuda-agent")
    first, second = (parse_args(["--leader-elect"]).leader_election for _ in range(2))
    assert first is not None and second is not None
    assert first.namespace == "cuda-agent" and first.lease_name == "cuda-agent-operator"
    # One identity per process: a restarted pod of the same name is a new candidate.
    assert first.identity.startswith("cuda-agent-operator-7d9f-abcde_") and first.identity != second.identity
    assert parse_args([]).leader_election is None


def test_leader_election_without_a_namespace_or_with_disordered_timings_names_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr("cuda_agent.operator.cli.SERVICE_ACCOUNT_NAMESPACE", Path("/nonexistent"))
    with pytest.raises(SystemExit):
        parse_args(["--leader-elect"])
    assert "--leader-elect-resource-namespace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(
            [
                "--leader-elect",
                "--leader-elect-resource-namespace",
                "x",
                "--leader-elect-renew-deadline",
                "20",
            ]
        )
    assert "lease duration (15) > renew deadline (20)" in capsys.readouterr().err

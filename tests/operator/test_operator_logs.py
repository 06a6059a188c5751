"""The operator logs JSON lines through the same formatter as the trainer and the sandbox server: a
reconcile pass's changes are fields of the line (JSON keys), the object is `k8s_ref` (the key Kopf's own
lines use), Kopf's bookkeeping attributes are left out, CUDA_AGENT_LOG_FORMAT=text gives plain lines with
the same fields. Runs the operator's own logging set-up (`configure_operator_logging`, which `cuda-agent
operator` calls) and its `log_pass`; the cluster test (test_run_lifecycle_cluster) reads the same lines
from a running operator."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import kopf
import pytest

from cuda_agent.operator.cli import configure_operator_logging
from cuda_agent.operator.events import log_pass


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root, objects = logging.getLogger(), logging.getLogger("kopf.objects")
    saved = (root.level, list(root.handlers), objects.level)
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    objects.setLevel(saved[2])


def test_a_pass_is_one_json_line_with_its_changes_as_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_AGENT_LOG_FORMAT", raising=False)
    monkeypatch.delenv("CUDA_AGENT_LOG_LEVEL", raising=False)
    stream = io.StringIO()
    configure_operator_logging(verbose=False, stream=stream)
    changes = {"phase": "Queued", "conditions": ["Admitted=False/Queued"], "removed": []}
    log_pass("TrainingRun", "team-a", "tr-1", **changes)
    log_pass("TrainingRun", "team-a", "tr-1")  # a quiet pass logs nothing
    # Kopf's object loggers add `settings` and `k8s_skip` to each record; neither is a field of the line.
    # Real settings with k8s_skip set: Kopf's own K8sPoster, which an earlier in-process operator test in
    # the same worker may have left on the kopf loggers, reads `settings.posting` and must post nothing.
    logging.getLogger("kopf.objects").warning(
        "Handler failed",
        extra={"settings": kopf.OperatorSettings(), "k8s_skip": True, "k8s_ref": {"name": "tr-1"}},
    )
    reconciled, kopf_line = (json.loads(line) for line in stream.getvalue().splitlines())
    assert reconciled["logger"] == "cuda_agent.operator.reconcile" and reconciled["level"] == "INFO"
    assert reconciled["message"] == "reconciled TrainingRun team-a/tr-1"
    assert reconciled["k8s_ref"] == {"kind": "TrainingRun", "namespace": "team-a", "name": "tr-1"}
    assert reconciled["phase"] == "Queued" and reconciled["conditions"] == ["Admitted=False/Queued"]
    assert "removed" not in reconciled  # unchanged fields are not logged
    assert set(kopf_line) == {"time", "level", "logger", "message", "k8s_ref"}
    assert logging.getLogger().level == logging.INFO
    assert logging.getLogger("kopf.objects").level == logging.WARNING  # its per-handler INFO lines off


def test_text_format_and_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_AGENT_LOG_FORMAT", "text")
    stream = io.StringIO()
    configure_operator_logging(verbose=True, stream=stream)
    log_pass("SandboxPool", "team-a", "pool", replicas=3)
    line = stream.getvalue().rstrip()
    assert "INFO cuda_agent.operator.reconcile: reconciled SandboxPool team-a/pool " in line
    assert line.endswith("replicas=3")
    assert logging.getLogger().level == logging.DEBUG


def test_a_bad_log_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_AGENT_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="CUDA_AGENT_LOG_FORMAT='xml'"):
        configure_operator_logging(verbose=False)

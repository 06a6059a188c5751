"""Contract tests of the sandbox server's HTTP API: sessions, judging, reward service, status, OpenAPI."""

from __future__ import annotations

import json
import time

import pytest
from sandbox_helpers import TASK, RunningServer, cleanup, needs_root, start_server

from cuda_agent.sandbox.client import SandboxError, SyncSandboxClient
from cuda_agent.sandbox.server.app import ROUTES
from cuda_agent.sandbox.server.models import EvaluateRequest, ServerStatus, TaskRef
from cuda_agent.sandbox.server.tools import TOOLS

pytestmark = needs_root()


def _post(server: RunningServer, path: str, body: object) -> tuple[int, dict]:
    status, payload = server.client.request("POST", path, json.dumps(body).encode())
    return status, json.loads(payload)


def test_openapi_document_covers_every_route_and_resolves_every_ref(server: RunningServer) -> None:
    status, payload = server.client.request("GET", "/openapi.json")
    doc = json.loads(payload)
    assert status == 200 and doc["openapi"].startswith("3.1")
    for route in ROUTES:
        assert route.method.lower() in doc["paths"][route.path], route.path
    schemas = doc["components"]["schemas"]
    refs = [m for m in _walk(doc) if isinstance(m, str) and m.startswith("#/components/schemas/")]
    assert refs and all(r.rsplit("/", 1)[1] in schemas for r in refs)
    bash_op = doc["paths"]["/v1/sessions/{session_id}/tools/bash"]["post"]
    assert bash_op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/BashInput")
    assert "command" in schemas["BashInput"]["properties"]
    assert "activeSessions" in schemas["ServerStatus"]["properties"]


def _walk(node: object) -> list[object]:
    if isinstance(node, dict):
        return [v for value in node.values() for v in [value, *_walk(value)]]
    if isinstance(node, list):
        return [v for value in node for v in [value, *_walk(value)]]
    return []


def test_tool_list_gives_every_tool_with_its_input_schema(server: RunningServer) -> None:
    status, payload = server.client.request("GET", "/v1/tools")
    tools = {t["name"]: t for t in json.loads(payload)["tools"]}
    assert status == 200 and set(tools) == set(TOOLS)
    assert tools["edit"]["input_schema"]["required"] == ["file_path", "old_string", "new_string"]


def test_session_workspace_holds_task_skill_frozen_bindings_and_entry_points(
    server: RunningServer, session_id: str
) -> None:
    client = server.client
    model = client.tool(session_id, "read", {"file_path": "model.py"})
    assert "class Model(nn.Module)" in model.output and model.output.startswith("     1\timport torch")
    skill = client.tool(session_id, "read", {"file_path": "SKILL.md"})
    assert "verify" in skill.output and client.get_session(session_id).workspace in skill.output
    listing = client.tool(session_id, "bash", {"command": "ls kernels; command -v compile verify profile"})
    assert "binding.cpp" in listing.output and "binding_registry.h" in listing.output
    assert listing.output.count("/bin/") == 3


def test_bad_session_requests_name_the_problem(server: RunningServer) -> None:
    status, body = _post(server, "/v1/sessions", {})
    assert status == 422 and body["error"].startswith("invalid CreateSessionRequest: task")
    status, body = _post(server, "/v1/sessions", {"task": {"source": TASK, "uri": "s3://b/k"}})
    assert status == 422 and "exactly one of task.source or task.uri" in body["error"]
    status, body = _post(server, "/v1/sessions", {"task": {"uri": "file:///etc/passwd"}})
    assert status == 400 and "s3://" in body["error"]
    status, body = _post(server, "/v1/sessions", {"task": {"source": TASK}, "device": "cuda"})
    assert status == 400 and "no GPU" in body["error"]
    status, raw = server.client.request("POST", "/v1/sessions", b"{not json")
    assert status == 400 and "not valid JSON" in json.loads(raw)["error"]


def test_unknown_session_is_404_for_every_session_route(server: RunningServer) -> None:
    for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/tools/bash"), ("POST", "/judge")):
        body = b'{"command": "true"}' if path.endswith("bash") else (b"{}" if method == "POST" else None)
        status, raw = server.client.request(method, f"/v1/sessions/nosuchsession{path}", body)
        assert status == 404 and "unknown session" in json.loads(raw)["error"], (method, path)


def test_session_lifecycle_list_get_delete(server: RunningServer) -> None:
    info = server.client.create_session(TASK, name="lifecycle")
    listed = json.loads(server.client.request("GET", "/v1/sessions")[1])["sessions"]
    assert info.session_id in {s["session_id"] for s in listed}
    assert server.client.get_session(info.session_id).task_name == "lifecycle"
    deleted = server.client.delete_session(info.session_id)
    assert deleted.deleted
    with pytest.raises(SandboxError) as err:
        server.client.get_session(info.session_id)
    assert err.value.status == 404


def test_abandoned_session_is_deleted_after_its_ttl(server: RunningServer) -> None:
    info = server.client.create_session(TASK, ttl_s=1)
    deadline = time.monotonic() + 30
    status = 200
    while status == 200 and time.monotonic() < deadline:
        time.sleep(0.5)
        status = server.client.request("GET", f"/v1/sessions/{info.session_id}")[0]
    assert status == 404


def test_compile_verify_profile_commands_judge_the_workspace(server: RunningServer, session_id: str) -> None:
    client = server.client
    client.tool(session_id, "write", {"file_path": "model_new.py", "content": "class ModelNew: pass\n"})
    verify = client.tool(session_id, "bash", {"command": "verify; echo rc=$?"})
    assert "correct: yes" in verify.output and "rc=0" in verify.output
    profile = client.tool(session_id, "bash", {"command": "profile"})
    assert "reward: 3" in profile.output and "speedup: vs eager 2.000x" in profile.output
    client.tool(session_id, "write", {"file_path": "kernels/k.cpp", "content": "// BUILD_ERROR\n"})
    compiled = client.tool(session_id, "bash", {"command": "compile; echo rc=$?"})
    assert (
        "compiled: no" in compiled.output and "rc=1" in compiled.output and "BUILD_ERROR" in compiled.output
    )
    as_json = client.tool(session_id, "bash", {"command": "verify --json"})
    run = json.loads(as_json.output)
    assert run["stage"] == "verify" and run["result"]["candidate_kind"] == "dir"
    # The stage's options as they arrived: the JudgeConfig the judge's own CLI code built from them.
    config = run["result"]["config"]
    assert (config["profile"]["trials"], config["compile_mode"]) == (3, "none")


def test_session_judge_endpoint_returns_the_judge_run(server: RunningServer, session_id: str) -> None:
    server.client.tool(session_id, "write", {"file_path": "model_new.py", "content": "WRONG\n"})
    run = server.client.judge(session_id, "profile")
    assert run.result is not None and run.result.reward == -1 and not run.result.correct
    assert run.result.model_extra and run.result.model_extra["candidate_kind"] == "file"
    assert server.client.get_session(session_id).judge_runs == 1


def test_evaluate_is_a_stateless_reward_service(server: RunningServer) -> None:
    good = server.client.evaluate(
        EvaluateRequest(task=TaskRef(source=TASK), model_new="class ModelNew: pass")
    )
    assert good.reward == 3 and good.compiled and good.correct
    layout = EvaluateRequest(task=TaskRef(source=TASK), files={"model_new.py": "x", "kernels/a.cpp": "WRONG"})
    wrong = server.client.evaluate(layout)
    assert wrong.reward == -1 and wrong.model_extra and wrong.model_extra["candidate_kind"] == "dir"
    status, body = _post(server, "/v1/evaluate", {"task": {"source": "TASK_ERROR"}, "model_new": "x"})
    assert status == 422 and "judge rejected the task" in body["error"]
    status, body = _post(server, "/v1/evaluate", {"task": {"source": TASK}, "model_new": "x", "files": {}})
    assert status == 422 and "exactly one of model_new or files" in body["error"]
    status, body = _post(server, "/v1/evaluate", {"task": {"source": TASK}, "files": {"../escape.py": "x"}})
    # Refused by validation (422 naming the field), not by the judge's snapshot (which answered 503).
    assert status == 422 and "files" in body["error"] and "'..'" in body["error"]


def test_status_and_metrics_report_sessions_judging_and_cache(server: RunningServer, session_id: str) -> None:
    server.client.tool(session_id, "write", {"file_path": "model_new.py", "content": "cached candidate\n"})
    server.client.judge(session_id, "verify")
    server.client.judge(session_id, "verify")  # same content: the fake judge's cache hits
    status_raw = json.loads(server.client.request("GET", "/v1/status")[1])
    for key in (
        "activeSessions",
        "maxSessions",
        "queuedJudgeJobs",
        "runningJudgeJobs",
        "gpuBusyFraction",
        "buildCacheHits",
        "judgeIntact",
        "isolation",
    ):
        assert key in status_raw, key
    status = ServerStatus.model_validate(status_raw)
    assert status.active_sessions >= 1 and status.isolation == "root" and status.build_cache_hits >= 1
    code, metrics = server.client.request("GET", "/metrics")
    text = metrics.decode()
    assert code == 200
    assert "# TYPE cuda_agent_sandbox_active_sessions gauge" in text
    assert 'cuda_agent_sandbox_tool_calls_total{outcome="ok",tool="write"}' in text
    assert "cuda_agent_sandbox_queued_judge_jobs 0" in text
    assert "cuda_agent_sandbox_build_cache_hits_total" in text
    assert 'cuda_agent_sandbox_judge_runs_total{outcome="reward3",stage="verify"}' in text
    # The metrics-only listener (what a NetworkPolicy opens to Prometheus) serves the same families
    # and nothing of the session API.
    assert server.metrics_port
    scraper = SyncSandboxClient(f"http://127.0.0.1:{server.metrics_port}", timeout_s=30)
    code, scraped = scraper.request("GET", "/metrics")
    assert code == 200 and "# TYPE cuda_agent_sandbox_active_sessions gauge" in scraped.decode()
    for method, path in (("GET", "/v1/status"), ("GET", "/openapi.json"), ("POST", "/v1/sessions")):
        assert scraper.request(method, path)[0] == 404, path


@pytest.mark.minio
def test_task_from_s3_reference(minio_server: object) -> None:
    from minio import Minio

    from cuda_agent.storage import StorageConfig, open_store

    env = {
        "CUDA_AGENT_S3_ENDPOINT": minio_server.endpoint,  # type: ignore[attr-defined]
        "CUDA_AGENT_S3_SECURE": "false",
        "AWS_ACCESS_KEY_ID": minio_server.access_key,  # type: ignore[attr-defined]
        "AWS_SECRET_ACCESS_KEY": minio_server.secret_key,  # type: ignore[attr-defined]
    }
    admin = Minio(minio_server.endpoint, minio_server.access_key, minio_server.secret_key, secure=False)  # type: ignore[attr-defined]
    if not admin.bucket_exists("tasks"):
        admin.make_bucket("tasks")
    open_store("s3://tasks/relu.py", StorageConfig.from_env(env)).put_bytes(
        "s3://tasks/relu.py", TASK.encode()
    )
    running = start_server(env=env)
    try:
        info = running.client.create_session(task_uri="s3://tasks/relu.py")
        assert running.client.tool(info.session_id, "read", {"file_path": "model.py"}).output.count("\t") > 5
        # The storage secret is in the server's environment and must not reach agent commands.
        env_dump = running.client.tool(info.session_id, "bash", {"command": "env"}).output
        assert env["AWS_SECRET_ACCESS_KEY"] not in env_dump
        status, body = _post(running, "/v1/sessions", {"task": {"uri": "s3://tasks/missing.py"}})
        assert status == 400 and "cannot fetch task s3://tasks/missing.py" in body["error"]
    finally:
        cleanup(running)

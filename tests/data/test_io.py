"""Ops-6K parquet and KernelBench layouts, resumable synthesis through the CLI, s3:// output against the
real MinIO fixture, the LLM composer against a local stand-in endpoint, and the Ray fan-out."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures.ray_start import init_ray

from cuda_agent.data import synth
from cuda_agent.data.catalogue import Catalogue
from cuda_agent.data.cli import main as data_main
from cuda_agent.data.compose import (
    EndpointConfig,
    LLMComposer,
    ProgrammaticComposer,
    chat_backend,
    openai_chat,
)
from cuda_agent.data.filters import evaluate
from cuda_agent.data.pipeline import filter_samples
from cuda_agent.data.published import read_kernelbench, read_ops6k, write_ops6k
from cuda_agent.data.records import FilterConfig, Sample

QUICK = "composed,decontamination,no_stochastic_ops,runs_eager,deterministic,nontrivial_output,runtime"


def test_catalogue_records_coverage(catalogue: Catalogue) -> None:
    status = {e.name: e for e in catalogue.entries}
    for name in (
        "nn.Conv2d",
        "nn.Linear",
        "nn.LayerNorm",
        "nn.MaxPool2d",
        "F.gelu",
        "torch.sum",
        "torch.matmul",
    ):
        assert status[name].status == "runnable", status[name]
    assert status["nn.Dropout"].status == "excluded" and status["nn.Dropout"].reason == "stochastic"
    assert status["nn.Fold"].status == "unsupported" and status["nn.Fold"].reason
    assert status["nn.Conv2d"].required_args[:3] == ("in_channels", "out_channels", "kernel_size")
    assert status["transformers.NewGELUActivation"].status == "runnable"
    assert all(e.reason for e in catalogue.entries if e.status != "runnable")
    assert set(catalogue.coverage()) == {"runnable", "failed", "unsupported", "excluded"}


def test_composer_is_seeded_and_counts_ops(catalogue: Catalogue) -> None:
    composer = ProgrammaticComposer(catalogue, seed=5)
    samples = [composer.compose(i) for i in range(40)]
    assert composer.compose(7) == samples[7]
    assert ProgrammaticComposer(catalogue, seed=6).compose(7).code != samples[7].code
    assert {s.n_ops for s in samples} <= {1, 2, 3, 4, 5} and len({s.n_ops for s in samples}) >= 3
    for s in samples:
        assert s.data_source.split("#")[1] == str(s.n_ops)
        assert "def get_inputs():" in s.code and "def get_init_inputs():" in s.code


def _samples() -> list[Sample]:
    return [
        Sample(
            id="a", ops=["nn.Conv2d", "torch.relu"], data_source="torch#2", code="print(1)\n", accepted=True
        ),
        Sample(id="b", ops=["torch.sum"], data_source="torch#1", code="x = 2\n", rejected_by="runtime"),
    ]


def test_ops6k_parquet_round_trip(tmp_path: Path) -> None:
    write_ops6k(_samples(), str(tmp_path / "set.parquet"))
    assert read_ops6k(str(tmp_path / "set.parquet")) == _samples()
    # The released layout: only the three columns, ops as a string holding a list.
    released = pa.table(
        {"ops": ['["nn.Linear", "nn.GELU"]'], "data_source": ["torch#2"], "code": ["c = 1\n"]}
    )
    pq.write_table(released, tmp_path / "released.parquet")
    (read,) = read_ops6k(str(tmp_path / "released.parquet"))
    assert read.ops == ["nn.Linear", "nn.GELU"] and read.id == "ops6k-00000" and read.code == "c = 1\n"
    pq.write_table(pa.table({"ops": [["x"]], "code": ["c"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"missing column.*data_source"):
        read_ops6k(str(tmp_path / "bad.parquet"))


def test_kernelbench_layout(tmp_path: Path) -> None:
    task = (Path(__file__).resolve().parents[2] / "examples/tasks/row_sum.py").read_text()
    for rel in ("level1/1_row_sum.py", "level2/7_row_sum.py", "level1/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(task if rel.endswith("sum.py") else "")
    tasks = read_kernelbench(str(tmp_path))
    assert [(t.name, t.level) for t in tasks] == [
        ("level1/1_row_sum.py", "level1"),
        ("level2/7_row_sum.py", "level2"),
    ]


def test_synth_cli_is_resumable(tmp_path: Path, catalogue: Catalogue) -> None:
    out = tmp_path / "run"
    args = ["synth", "--out", str(out), "--seed", "2", "--batch-size", "3", "--filters", QUICK]
    assert data_main([*args, "--n", "2"]) == 0
    first_shards = {p.name: p.read_bytes() for p in (out / "shards").iterdir()}
    assert data_main([*args, "--n", "5", "--workers", "2"]) == 0  # the process-pool path
    shards = {p.name: p.read_bytes() for p in (out / "shards").iterdir()}
    assert all(shards[name] == data for name, data in first_shards.items())  # nothing recomposed
    ids = [json.loads(line)["id"] for data in shards.values() for line in data.decode().splitlines()]
    assert len(ids) == len(set(ids))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accepted"] == 5 and abs(sum(summary["ops_share"].values()) - 1) < 1e-9
    assert set(summary["rejections"]) == set(QUICK.split(","))
    assert set(summary["runtime_ms"]) == {"p10", "p50", "p90"} and summary["runtime_ms"]["p50"] > 0
    dataset = read_ops6k(str(out / "dataset.parquet"))
    assert len(dataset) == 5 and all(s.accepted and s.verdicts for s in dataset)
    jsonl_ids = [json.loads(line)["id"] for line in (out / "dataset.jsonl").read_text().splitlines()]
    assert jsonl_ids == [s.id for s in dataset]


def test_synth_to_minio(minio_server: Any, monkeypatch: pytest.MonkeyPatch, catalogue: Catalogue) -> None:
    from cuda_agent.storage import StorageConfig
    from cuda_agent.storage.s3 import S3Store

    monkeypatch.setenv("CUDA_AGENT_S3_ENDPOINT", f"http://{minio_server.endpoint}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio_server.secret_key)
    out = "s3://data-synth/runs/r1"
    store = S3Store(StorageConfig.from_env())
    store.ensure_bucket(out)
    # The benchmark set in KernelBench layout on MinIO too.
    examples = Path(__file__).resolve().parents[2] / "examples" / "tasks"
    store.upload_file(examples / "row_sum.py", "s3://data-synth/bench/level1/1_row_sum.py")
    store.upload_file(examples / "cumsum.py", "s3://data-synth/bench/level2/3_cumsum.py")
    bench = read_kernelbench("s3://data-synth/bench")
    assert [(t.name, t.level) for t in bench] == [
        ("level1/1_row_sum.py", "level1"),
        ("level2/3_cumsum.py", "level2"),
    ]
    config = synth.SynthConfig(
        n=2,
        out=out,
        seed=4,
        batch_size=2,
        benchmark="s3://data-synth/bench",
        filters=FilterConfig.for_device("cpu", enabled=tuple(QUICK.split(","))),
    )
    composer = ProgrammaticComposer(catalogue, seed=4)
    summary = synth.run(config, composer, synth.benchmark_index(config.benchmark))
    assert summary.accepted == 2
    dataset = read_ops6k(out + "/dataset.parquet")
    assert len(dataset) == 2
    assert all("closest level" in s.verdicts[1].detail for s in dataset)  # checked against the MinIO set
    assert len(synth.load_existing(out)) == summary.candidates
    again = synth.run(config, composer)  # resumed from MinIO: nothing new composed
    assert again.candidates == summary.candidates


class _StandInModel(BaseHTTPRequestHandler):
    """Plays an OpenAI-compatible chat endpoint: it stands in for a model and answers every prompt with
    the same fused task (or with prose and no code block when the prompt says so)."""

    TASK = (
        "Here it is:\n```python\nimport torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.norm = nn.LayerNorm(64)\n\n"
        "    def forward(self, x):\n        return torch.tanh(self.norm(x)).sum(dim=-1)\n\n\n"
        "def get_inputs():\n    return [torch.randn(16, 64)]\n\n\n"
        "def get_init_inputs():\n    return []\n```\n"
    )
    prompts: list[Any] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.prompts.append(body)
        text = "I cannot." if body["model"] == "refuser" else self.TASK
        reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandInModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_llm_composer_against_stand_in_endpoint(stand_in_endpoint: str, catalogue: Catalogue) -> None:
    chat = openai_chat(EndpointConfig(base_url=stand_in_endpoint, model="stand-in"))
    composer = LLMComposer(catalogue, chat, seed=1)
    sample = composer.compose(0)
    prompt = _StandInModel.prompts[-1]["messages"][-1]["content"]
    assert all(op in prompt for op in sample.ops) and sample.composer == "llm"
    config = FilterConfig.for_device("cpu", enabled=tuple(QUICK.split(",")))
    assert evaluate(sample, config).accepted
    refused = LLMComposer(catalogue, openai_chat(EndpointConfig(base_url=stand_in_endpoint, model="refuser")))
    rejected = evaluate(refused.compose(0), config)
    assert rejected.rejected_by == "composed" and "no fenced code block" in rejected.verdicts[0].detail


def test_llm_composer_through_a_rollout_chat_backend(stand_in_endpoint: str, catalogue: Catalogue) -> None:
    from cuda_agent.rollout.openai_http import OpenAIChatBackend

    composer = LLMComposer(catalogue, chat_backend(OpenAIChatBackend(stand_in_endpoint, "stand-in")), seed=2)
    first, second = composer.compose(0), composer.compose(1)  # two calls: two event loops
    assert "class Model" in first.code and first.code == second.code and first.ops != second.ops


def test_filter_cli_refilters_a_published_set(tmp_path: Path, catalogue: Catalogue) -> None:
    good = ProgrammaticComposer(catalogue, seed=8).compose(0)
    constant = good.model_copy(
        update={"id": "constant", "code": good.code.replace("return x", "return x * 0.0")}
    )
    write_ops6k([good, constant], str(tmp_path / "in.parquet"))
    out = tmp_path / "refiltered"
    assert (
        data_main(["filter", "--input", str(tmp_path / "in.parquet"), "--out", str(out), "--filters", QUICK])
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accepted"] == 1 and summary["rejections"]["nontrivial_output"] == 1
    assert [s.id for s in read_ops6k(str(out / "dataset.parquet"))] == [good.id]


@pytest.mark.ray
def test_ray_fan_out_matches_inline(catalogue: Catalogue) -> None:
    import ray

    composer = ProgrammaticComposer(catalogue, seed=9)
    samples = [composer.compose(i) for i in range(3)]
    config = FilterConfig.for_device(
        "cpu", enabled=("composed", "no_stochastic_ops", "runs_eager", "deterministic")
    )
    started = not ray.is_initialized()
    if started:
        init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = list(filter_samples(samples, config, workers=2, use_ray=True))
    finally:
        if started:
            ray.shutdown()
    inline = [evaluate(s, config) for s in samples]
    assert [(s.id, s.accepted, s.rejected_by) for s in remote] == [
        (s.id, s.accepted, s.rejected_by) for s in inline
    ]

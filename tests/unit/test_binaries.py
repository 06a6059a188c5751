"""The Go-binary builder: what `make demo` builds, that it runs without the virtualenv, and its concurrency.

The concurrency and stamp tests put a fake `go` on PATH (a shell script that writes the binaries it is asked
for): a real cold build of these modules takes 10-30 min on this machine. The real toolchain builds every
binary through `binaries.ensure` in the cluster, MinIO and helm tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.localcluster import binaries

REPO = Path(__file__).resolve().parents[2]

FAKE_GO = r"""#!/usr/bin/env bash
# Records when it ran, then writes the binaries go would: `build ... -o DIR/ PKG...` or `install ... PKG@V`.
echo "start $(date +%s.%N) $$" >> "$FAKE_GO_LOG"
sleep 1
if [ -n "${FAKE_GO_FAIL:-}" ] && [[ " $* " == *"$FAKE_GO_FAIL"* ]]; then
  echo "fake go: cannot build $FAKE_GO_FAIL" >&2; exit 2
fi
out=""; packages=()
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift 2;;
    build|install|-trimpath|-buildvcs=*|-gcflags=*|-ldflags=*) shift;;
    *) packages+=("$1"); shift;;
  esac
done
for package in "${packages[@]}"; do
  path="${package%@*}"; name="${path##*/}"
  if [[ "$name" =~ ^v[0-9]+$ ]]; then parent="${path%/*}"; name="${parent##*/}"; fi
  target="${out:-$GOBIN/}$name"; printf '#!/bin/sh\n' > "$target"; chmod +x "$target"
done
echo "end $(date +%s.%N) $$" >> "$FAKE_GO_LOG"
"""


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tool_dir = tmp_path / "tools"
    tool_dir.mkdir()
    go = tool_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    log = tmp_path / "go.log"
    log.touch()
    monkeypatch.setenv("PATH", f"{tool_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GO_LOG", str(log))
    monkeypatch.setenv("CUDA_AGENT_BIN_DIR", str(tmp_path / "bin"))
    return log


def _intervals(log: Path) -> list[tuple[float, float]]:
    starts: dict[str, float] = {}
    intervals = []
    for line in log.read_text().splitlines():
        kind, when, pid = line.split()
        if kind == "start":
            starts[pid] = float(when)
        else:
            intervals.append((starts[pid], float(when)))
    return intervals


def test_builder_imports_without_the_virtualenv() -> None:
    """`make demo` starts the builder with the machine's Python before pip has installed anything: the
    module must load with no site-packages at all (-S) and pull in nothing but the standard library."""
    probe = (
        "import sys, cuda_agent.localcluster.binaries as b; "
        "third = sorted(m for m in sys.modules if m.split('.')[0] in {'pydantic', 'yaml'}); "
        "print(third, ','.join(b.BINARY_SETS['demo']))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "platform")}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, cwd=REPO, check=True
    )
    assert proc.stdout.strip().startswith("[] etcd,kube-apiserver"), proc.stdout + proc.stderr


def test_demo_set_is_what_the_demo_starts_and_no_helm() -> None:
    demo = set(binaries.BINARY_SETS["demo"])
    # cluster.LocalCluster.up ensures the control plane and kwokctl drives it; LocalMinio ensures minio.
    assert demo == {*binaries.CONTROL_PLANE_BINARIES, "kwokctl", "minio"}
    assert "helm" not in demo
    assert set(binaries.BINARY_SETS["all"]) == set(binaries.BINARIES)


def test_cli_refuses_names_with_a_set(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        binaries.main(["build", "--for", "demo", "helm"])
    assert exited.value.code == 2
    assert "not both" in capsys.readouterr().err


def test_groups_build_two_at_a_time_and_are_then_reused(fake_go: Path) -> None:
    paths = binaries.build(list(binaries.BINARY_SETS["demo"]))
    assert all(path.is_file() and os.access(path, os.X_OK) for path in paths)
    intervals = _intervals(fake_go)
    # demo = kubernetes (4 binaries) + etcd + kwok/kwokctl + minio: four go invocations.
    assert len(intervals) == 4
    overlapping = [
        (a, b) for i, a in enumerate(intervals) for b in intervals[i + 1 :] if a[0] < b[1] and b[0] < a[1]
    ]
    assert overlapping, f"no two builds ran at once: {intervals}"
    # Never more than PARALLEL_BUILDS at once.
    for start, _ in intervals:
        running = sum(1 for s, e in intervals if s <= start < e)
        assert running <= binaries.PARALLEL_BUILDS
    records = {name: binaries.read_record(name) for name in binaries.BINARY_SETS["demo"]}
    assert all(r is not None and r.build_key == binaries.BINARIES[n].build_key() for n, r in records.items())

    binaries.build(list(binaries.BINARY_SETS["demo"]))
    assert len(_intervals(fake_go)) == 4, "current binaries were rebuilt"


def test_a_failed_group_names_itself_and_the_others_still_land(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GO_FAIL", "github.com/minio/minio")
    with pytest.raises(binaries.BuildError, match=r"building minio failed \(exit 2\)") as failed:
        binaries.build(list(binaries.BINARY_SETS["demo"]))
    assert "cannot build github.com/minio/minio" in str(failed.value)
    assert not binaries.is_current(binaries.BINARIES["minio"])
    assert binaries.is_current(binaries.BINARIES["etcd"])
    assert binaries.is_current(binaries.BINARIES["kube-apiserver"])


def test_a_torn_stamp_means_rebuild(fake_go: Path) -> None:
    binaries.build(["etcd"])
    stamp = binaries.bin_dir() / ".stamps" / "etcd.json"
    for torn in ("{", "[]", '{"name": "etcd"}', stamp.read_text().replace('"etcd"', "7", 1)):
        stamp.write_text(torn)
        assert binaries.read_record("etcd") is None, torn
        assert not binaries.is_current(binaries.BINARIES["etcd"])


def test_go_is_asked_for_stripped_binaries_without_debug_info(tmp_path: Path) -> None:
    kube = [binaries.BINARIES[name] for name in ("kube-apiserver", "kubectl")]
    command, cwd = binaries._go_command("go", kube, tmp_path)
    assert cwd == binaries.GOMOD_DIR / "kubernetes"
    assert command[:2] == ["go", "build"]
    assert {"-trimpath", "-buildvcs=false", "-gcflags=all=-dwarf=false"} <= set(command)
    ldflags = next(flag for flag in command if flag.startswith("-ldflags="))
    assert ldflags.startswith("-ldflags=-s -w ") and "gitVersion=v1.36.3" in ldflags
    command, cwd = binaries._go_command("go", [binaries.BINARIES["minio"]], tmp_path)
    assert cwd is None and command[1] == "install" and command[-1].startswith("github.com/minio/minio@")

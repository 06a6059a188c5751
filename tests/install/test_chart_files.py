"""The chart's generated files are files, current, and what Helm reads: the CRDs (`make crds` writes crds/
and charts/cuda-agent/crds/), the seccomp profiles it installs (copies of sandbox_image/seccomp/) and its
README's values table (scripts/chart_readme.py from values.schema.json). Symbolic links made every helm
command print "found symbolic link in path" INFO lines and broke a packaged chart; a stale copy fails here
with the command that refreshes it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from install_helpers import CHART, REPO, Helm

SCRIPT = REPO / "scripts" / "chart_readme.py"
_spec = importlib.util.spec_from_file_location("chart_readme", SCRIPT)
assert _spec is not None and _spec.loader is not None
chart_readme = importlib.util.module_from_spec(_spec)
sys.modules["chart_readme"] = chart_readme
_spec.loader.exec_module(chart_readme)


def _same_files(copy: Path, source: Path, pattern: str) -> None:
    names = sorted(p.name for p in source.glob(pattern))
    assert names and sorted(p.name for p in copy.glob(pattern)) == names, "run `make crds`"
    for name in names:
        assert not (copy / name).is_symlink() and (copy / name).is_file(), f"{copy / name}: not a plain file"
        assert (copy / name).read_bytes() == (source / name).read_bytes(), (
            f"{copy / name} is stale: run `make crds`"
        )


def test_crds_and_seccomp_profiles_are_plain_current_copies() -> None:
    assert not (CHART / "crds").is_symlink()
    _same_files(CHART / "crds", REPO / "crds", "*.yaml")
    _same_files(CHART / "files" / "seccomp", REPO / "sandbox_image" / "seccomp", "*.json")


def test_helm_reads_the_chart_without_following_links(helm: Helm) -> None:
    proc = helm("template", "rel", str(CHART))
    assert "symbolic link" not in proc.stderr, proc.stderr
    links = [str(p.relative_to(CHART)) for p in CHART.rglob("*") if p.is_symlink()]
    assert links == []


def test_readme_values_table_is_current_and_every_value_is_described() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert chart_readme.undescribed(schema) == []
    assert chart_readme.expected_readme() == (CHART / "README.md").read_text(), "stale: run `make crds`"
    rows = [line for line in (CHART / "README.md").read_text().splitlines() if line.startswith("| `")]
    keys = [row.split("`")[1] for row in rows]
    assert keys == [key for key, _ in chart_readme.leaves(schema)]
    assert "| `operator.replicas` | integer (>= 1) | `1` |" in (CHART / "README.md").read_text()

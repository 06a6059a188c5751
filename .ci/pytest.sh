#!/usr/bin/env bash
# Runs pytest and refuses to pass when nothing was collected (pytest exit code 5). Two pytest-xdist
# workers: most tests wait on subprocesses (control plane, sandbox servers, judges), so two share the
# cores well; tests/conftest.py keeps each machine-wide resource's tests (control plane, Ray) in one worker.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -ra --durations=25 -n "${PYTEST_WORKERS:-2}" --dist loadgroup "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"

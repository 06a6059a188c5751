#!/usr/bin/env bash
# Runs pytest and refuses to pass when nothing was collected (pytest exit code 5). Two pytest-xdist
# workers: most tests wait on subprocesses (control plane, sandbox servers, judges), so two share the
# cores well; tests/conftest.py keeps each machine-wide resource's tests (control plane, Ray) in one worker,
# and each module with module-scoped fixtures in one worker (its fixtures built once).
# --no-loadscope-reorder: work units go out in collection order. xdist's default sorts them by test count,
# which would start the Ray group (7 tests, the longest unit) after every module with more tests.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -ra --durations=25 -n "${PYTEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"

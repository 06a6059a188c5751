#!/usr/bin/env bash
# Runs pytest and refuses to pass when nothing was collected (pytest exit code 5).
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -ra --durations=25 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"

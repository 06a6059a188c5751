"""schemathesis against the server's own /openapi.json: whatever body, path or parameter the schema
allows to be sent (and its negative variants), the server never answers 5xx.

Bounded for CI (a few examples per operation, fixed seed, no shrinking: ~20 s on two cores). Sessions
created by the fuzzer expire after 5 s, and capacity is large, so "no capacity" (503) never happens.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sandbox_helpers import cleanup, start_server

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


def test_schemathesis_finds_no_server_error(tmp_path: Path) -> None:
    server = start_server("--max-sessions", "90", "--session-ttl-s", "5")
    try:
        run = subprocess.run(
            [
                str(SCHEMATHESIS),
                "run",
                f"{server.url}/openapi.json",
                "--checks",
                "not_a_server_error",
                "--phases",
                "examples,coverage,fuzzing",
                "--max-examples",
                "8",
                "--seed",
                "1",
                "--no-shrink",
                "--generation-database",
                "none",
                # One worker: with two threads, hypothesis' ast.parse of its lambdas hit CPython 3.11.7's
                # "AST constructor recursion depth mismatch" (a race of that interpreter, not a server error).
                "--workers",
                "1",
                "--request-timeout",
                "60",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,  # its example database and reports stay out of the repository
        )
        assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
        assert "passed" in run.stdout
        assert server.healthy()
    finally:
        cleanup(server)

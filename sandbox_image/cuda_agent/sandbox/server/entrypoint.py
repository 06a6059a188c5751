#!/usr/bin/env python3
"""`compile`, `verify` and `profile` inside a sandbox session: hand the workspace to the judge.

Installed (as three names of one script) into the session's bin directory, which is on the agent's PATH.
Agent commands have no network, so the request goes over the session's Unix socket; the server snapshots
the workspace read-only, runs the judge as another user and answers with one JSON line. Standard library
only: it runs under the agent's uid with `python -I -S`.

Exit status: 0 when the stage succeeded (compile: it built; verify/profile: the result is correct),
1 when it did not, 2 when the judge could not be reached or refused to run.
"""

import json
import os
import socket
import sys

DEFAULT_SOCKET = ""
TOKEN = ""  # the session's channel token, written in when the server installs this script
STAGES = ("compile", "verify", "profile")


def main(argv: list[str]) -> int:
    stage = os.path.basename(argv[0])
    args = argv[1:]
    if stage not in STAGES:
        stage, args = (args[0], args[1:]) if args and args[0] in STAGES else ("", args)
    if not stage or any(a not in ("--json", "-h", "--help") for a in args):
        print(f"usage: {{{','.join(STAGES)}}} [--json]   (judges the current workspace)", file=sys.stderr)
        return 2
    if "-h" in args or "--help" in args:
        print(__doc__)
        return 0
    path = os.environ.get("CUDA_AGENT_JUDGE_SOCKET") or DEFAULT_SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(path)
            conn.sendall(json.dumps({"stage": stage, "token": TOKEN}).encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                reply += chunk
    except OSError as exc:
        print(f"{stage}: cannot reach the sandbox server at {path!r}: {exc}", file=sys.stderr)
        return 2
    if not reply:
        print(f"{stage}: the sandbox server closed the connection without an answer", file=sys.stderr)
        return 2
    run = json.loads(reply)
    print(json.dumps(run, indent=2) if "--json" in args else run["text"])
    result = run.get("result")
    if result is None:
        return 2
    ok = result["compiled"] if stage == "compile" else result["correct"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

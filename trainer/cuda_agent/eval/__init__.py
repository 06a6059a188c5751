"""Evaluation of kernel-writing policies and of existing solutions on KernelBench-format task sets.

    cuda-agent eval --solutions DIR --tasks DIR|s3://...       judge existing solutions (no policy)
    cuda-agent eval --policy replay:FILE --tasks DIR|s3://...  a policy through the agent loop and judge

Reports pass rate, faster-than-eager / faster-than-compile rates, geometric-mean speedups and fast_p per
level and overall (docs/eval.md). Modules: models (pydantic), metrics (pure functions), tasks
(discovery), judging (local judges or a sandbox server), policy (agent-loop episodes), report, cli.
"""

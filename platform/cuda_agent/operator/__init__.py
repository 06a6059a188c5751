"""Kopf operator for SandboxPool and TrainingRun.

Layers import only downward: `handlers` (Kopf wiring) -> `pool_reconciler` / `run_reconciler` (one flat
list of steps per object, one status write) -> pure builders (`pool_children`, `run_children`,
`autoscaler`, `conditions`) and the two modules that do I/O: `kube` (the only one that talks to the
Kubernetes API) and `demand` (reads the sandbox pods' `/v1/status`).
"""

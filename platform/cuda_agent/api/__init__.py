"""The cuda-agent.io/v1alpha1 API: pydantic models of the TrainingRun and SandboxPool custom resources.

These models are the single source of the API. The CRDs in crds/ are generated from them (`cuda-agent
crds`), the operator reads and writes objects through them, and local runs validate YAML with them.
Python attributes are snake_case; the wire format (aliases) is Kubernetes camelCase.

Importing the package loads none of its modules: a name below is loaded from its module when first used
(PEP 562). This package is the bottom layer of every part, and a process that needs one light module of it
(the judge's worker reads cuda_agent.api.judge_files, standard library only) must not load pydantic and every
resource model with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cuda_agent.api.base import (
        API_VERSION,
        GROUP,
        VERSION,
        CelRule,
        Condition,
        ConditionStatus,
        CustomResource,
        ObjectMeta,
    )
    from cuda_agent.api.loader import (
        RESOURCE_KINDS,
        Problem,
        Resource,
        ResourceError,
        load_resource,
        load_resource_file,
        load_resources,
    )
    from cuda_agent.api.sandboxpool import (
        Autoscaling,
        GpuSpec,
        LimitsSpec,
        SandboxPool,
        SandboxPoolConditionType,
        SandboxPoolSpec,
        SandboxPoolStatus,
        SeccompProfile,
        SeccompProfileType,
        SecuritySpec,
    )
    from cuda_agent.api.trainingrun import (
        AgentSpec,
        AgentTool,
        CheckpointSpec,
        DatasetSource,
        ModelSource,
        PpoAlgorithm,
        PrecisionPolicy,
        ResourcesSpec,
        RewardScheme,
        RewardSpec,
        RftWarmup,
        SandboxPoolRef,
        SingleTurnPpoWarmup,
        Tolerance,
        TrainingMetrics,
        TrainingRun,
        TrainingRunConditionType,
        TrainingRunPhase,
        TrainingRunSpec,
        TrainingRunStatus,
        ValuePretrainingWarmup,
        WarmupSpec,
    )

__all__ = [
    "API_VERSION",
    "GROUP",
    "RESOURCE_KINDS",
    "VERSION",
    "AgentSpec",
    "AgentTool",
    "Autoscaling",
    "CelRule",
    "CheckpointSpec",
    "Condition",
    "ConditionStatus",
    "CustomResource",
    "DatasetSource",
    "GpuSpec",
    "LimitsSpec",
    "ModelSource",
    "ObjectMeta",
    "PpoAlgorithm",
    "PrecisionPolicy",
    "Problem",
    "Resource",
    "ResourceError",
    "ResourcesSpec",
    "RewardScheme",
    "RewardSpec",
    "RftWarmup",
    "SandboxPool",
    "SandboxPoolConditionType",
    "SandboxPoolRef",
    "SandboxPoolSpec",
    "SandboxPoolStatus",
    "SeccompProfile",
    "SeccompProfileType",
    "SecuritySpec",
    "SingleTurnPpoWarmup",
    "Tolerance",
    "TrainingMetrics",
    "TrainingRun",
    "TrainingRunConditionType",
    "TrainingRunPhase",
    "TrainingRunSpec",
    "TrainingRunStatus",
    "ValuePretrainingWarmup",
    "WarmupSpec",
    "load_resource",
    "load_resource_file",
    "load_resources",
]

# The modules the names above come from, in the order __getattr__ looks a name up.
_EXPORTING_MODULES = ("base", "loader", "sandboxpool", "trainingrun")

if not TYPE_CHECKING:  # mypy reads the imports above; a module __getattr__ would make it accept any name

    def __getattr__(name: str) -> object:
        if name in __all__:
            for module in _EXPORTING_MODULES:
                home = importlib.import_module(f"{__name__}.{module}")
                if name in vars(home):
                    globals()[name] = vars(home)[name]
                    return globals()[name]
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Telemetry configuration, read from the standard OpenTelemetry environment variables so that the Helm
chart's collector settings (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_RESOURCE_ATTRIBUTES`, ...) apply without
project-specific names; only what OpenTelemetry has no variable for is `CUDA_AGENT_*`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ExporterName = Literal["otlp", "console", "file", "none"]

# field -> environment variable
ENV_NAMES: dict[str, str] = {
    "service_name": "OTEL_SERVICE_NAME",
    "traces_exporter": "OTEL_TRACES_EXPORTER",
    "otlp_endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "otlp_traces_endpoint": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "traces_file": "CUDA_AGENT_TRACES_FILE",
    "metrics_port": "CUDA_AGENT_METRICS_PORT",
    "log_level": "CUDA_AGENT_LOG_LEVEL",
    "log_format": "CUDA_AGENT_LOG_FORMAT",
}

# Where a process is, as resource attributes: the run and pool it serves and the pod it runs in. The
# operator sets the CUDA_AGENT_* names (run contract) and the pod's downward API sets POD_NAME/POD_NAMESPACE;
# in a pod (KUBERNETES_SERVICE_HOST set) HOSTNAME is the pod's name too. The first variable set wins.
RESOURCE_ENV: dict[str, tuple[str, ...]] = {
    "cuda_agent.run": ("CUDA_AGENT_RUN_NAME",),
    "cuda_agent.pool": ("CUDA_AGENT_POOL_NAME",),
    "k8s.namespace.name": ("POD_NAMESPACE", "CUDA_AGENT_RUN_NAMESPACE"),
    "k8s.pod.name": ("POD_NAME", "HOSTNAME"),
}

# Enumerated values are accepted in any case, as the OpenTelemetry SDK does for its own variables.
_CASE_FOLD = {"traces_exporter": str.lower, "log_format": str.lower, "log_level": str.upper}


class TelemetryConfig(BaseModel):
    """Where traces go, where metrics are served and how logs look."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    service_name: str = "cuda-agent"
    traces_exporter: Literal["auto", "otlp", "console", "file", "none"] = Field(
        default="auto",
        description="auto: OTLP when an OTLP endpoint is set, else a file when traces_file is set, else none",
    )
    otlp_endpoint: str | None = Field(default=None, description="collector base URL; /v1/traces is added")
    otlp_traces_endpoint: str | None = Field(default=None, description="full traces URL, used as is")
    traces_file: str | None = Field(default=None, description="JSON lines of finished spans (file exporter)")
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="serve Prometheus /metrics on this port; 0: not served"
    )
    resource_attributes: dict[str, str] = Field(default_factory=dict)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_format: Literal["json", "text"] = "json"

    @property
    def traces_url(self) -> str | None:
        if self.otlp_traces_endpoint:
            return self.otlp_traces_endpoint
        if self.otlp_endpoint:
            return self.otlp_endpoint.rstrip("/") + "/v1/traces"
        return None

    @property
    def exporter(self) -> ExporterName:
        if self.traces_exporter == "auto":
            return "otlp" if self.traces_url else "file" if self.traces_file else "none"
        return self.traces_exporter

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, service_name: str | None = None
    ) -> TelemetryConfig:
        """Build from ENV_NAMES and RESOURCE_ENV; `service_name` is this process's default, which
        OTEL_SERVICE_NAME overrides. A bad value raises ValueError naming the variable."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {} if service_name is None else {"service_name": service_name}
        for field, name in ENV_NAMES.items():
            value = env.get(name, "").strip()
            if value:
                values[field] = _CASE_FOLD.get(field, str)(value)
        resource = {}
        in_pod = bool(env.get("KUBERNETES_SERVICE_HOST"))
        for attribute, names in RESOURCE_ENV.items():
            usable = [n for n in names if in_pod or n != "HOSTNAME"]  # elsewhere it names a machine
            found = next((env[n].strip() for n in usable if env.get(n, "").strip()), None)
            if found:
                resource[attribute] = found
        values["resource_attributes"] = resource
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = [
                f"environment variable {ENV_NAMES[str(error['loc'][0])]}={error['input']!r}: {error['msg']}"
                for error in exc.errors()
            ]
            raise ValueError("; ".join(problems)) from exc

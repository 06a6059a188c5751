"""Telemetry configuration, read from the standard OpenTelemetry environment variables so that the Helm
chart's collector settings (`OTEL_EXPORTER_OTLP_ENDPOINT`, ...) apply without project-specific names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ExporterName = Literal["otlp", "console", "none"]

# field -> environment variable
ENV_NAMES: dict[str, str] = {
    "service_name": "OTEL_SERVICE_NAME",
    "traces_exporter": "OTEL_TRACES_EXPORTER",
    "otlp_endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "otlp_traces_endpoint": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "log_level": "CUDA_AGENT_LOG_LEVEL",
    "log_format": "CUDA_AGENT_LOG_FORMAT",
}

# Enumerated values are accepted in any case, as the OpenTelemetry SDK does for its own variables.
_CASE_FOLD = {"traces_exporter": str.lower, "log_format": str.lower, "log_level": str.upper}


class TelemetryConfig(BaseModel):
    """Where traces go and how logs look."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    service_name: str = "cuda-agent"
    traces_exporter: Literal["auto", "otlp", "console", "none"] = Field(
        default="auto", description="auto: OTLP when an OTLP endpoint is set, otherwise none"
    )
    otlp_endpoint: str | None = Field(default=None, description="collector base URL; /v1/traces is added")
    otlp_traces_endpoint: str | None = Field(default=None, description="full traces URL, used as is")
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
            return "otlp" if self.traces_url else "none"
        return self.traces_exporter

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TelemetryConfig:
        """Build from ENV_NAMES; a bad value raises ValueError naming the variable."""
        env = os.environ if environ is None else environ
        values: dict[str, str] = {}
        for field, name in ENV_NAMES.items():
            value = env.get(name, "").strip()
            if value:
                values[field] = _CASE_FOLD.get(field, str)(value)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = [
                f"environment variable {ENV_NAMES[str(error['loc'][0])]}={error['input']!r}: {error['msg']}"
                for error in exc.errors()
            ]
            raise ValueError("; ".join(problems)) from exc

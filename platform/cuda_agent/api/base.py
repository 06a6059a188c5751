"""Building blocks shared by the cuda-agent.io resources: the base model, CEL rules, conditions, metadata.

Every rule a spec must obey is declared once, next to its field, as a `CelRule`. The CRD generator copies
it into `x-kubernetes-validations` (the apiserver enforces it at admission) and pydantic runs the same
check in Python, so a local run (`cuda-agent run --local`, no apiserver) rejects the same specs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StrictInt,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

GROUP = "cuda-agent.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Kubernetes CEL budgets a rule by the worst case of its inputs, so every string and list a rule can
# reach needs a bound. These are the bounds used throughout the API.
MAX_NAME = 253
MAX_URI = 1024
MAX_IMAGE = 512
MAX_LIST = 32
MAX_CONDITIONS = 16

# DNS-1123 subdomain: names of objects the operator creates or references (pools, claims, runtime classes).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# DNS-1035 label: names that become Service names (which must also start with a letter).
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# A resource quantity as Kubernetes writes memory and storage sizes ("512Mi", "32Gi", "1000000").
QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` entry and, where it needs no old object, the same check in Python.

    Used two ways: in a model's `cel_rules` (the rule's `self` is the object) or as `Annotated` metadata
    on a field (`self` is the field's value; a rule on an object-typed field stays with that field and
    is not copied to other uses of the model). `field_path` (".minReplicas") makes the apiserver report
    the error at that sub-field; `check` must agree with `rule` and is None only for transition rules,
    which compare with `oldSelf` and so can only run at admission.
    """

    rule: str
    message: str
    field_path: str | None = None
    reason: Literal["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired"] | None = None
    check: Callable[[Any], bool] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.check is None and "oldSelf" not in self.rule:
            raise ValueError(f"CEL rule {self.rule!r} needs a Python check (only oldSelf rules may omit it)")

    def to_crd(self) -> dict[str, str]:
        """The entry as the CRD schema spells it."""
        entry = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            entry["fieldPath"] = self.field_path
        if self.reason is not None:
            entry["reason"] = self.reason
        return entry

    def validate(self, value: Any) -> Any:
        """Raise ValueError with the rule's message when the Python check fails; return value unchanged."""
        if self.check is not None and not self.check(value):
            raise ValueError(self.message)
        return value

    # As Annotated metadata: add the check after the field's own validation and the rule to its schema.
    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        inner = handler(source)
        if self.check is None:
            return inner
        return core_schema.no_info_after_validator_function(self.validate, inner)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.setdefault("x-kubernetes-validations", []).append(self.to_crd())
        return json_schema


def immutable(field_name: str, why: str) -> CelRule:
    """A transition rule that forbids changing `field_name` once the object exists."""
    return CelRule("self == oldSelf", f"{field_name} is immutable: {why}", reason="FieldValueForbidden")


# Artifact locations the storage layer can read: `s3://bucket/key`, `pvc://claim/path` or an absolute
# path (local runs). The same expression runs in CEL (RE2) and Python (re), so it avoids syntax on which
# the two differ.
_S3 = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?"
_PVC = r"pvc://[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?(/.*)?"
_DOT_DOT = r"(^|/)\.\.(/|$)"
# Not normalised: empty or "." segments, percent-encoded dots, slashes, backslashes or NUL (a ".." after
# decoding), control characters.
_UNNORMALISED = r"(^|[^:])//|(^|/)\.(/|$)|%(2[eEfF]|5[cC]|00)|[\x00-\x1f\x7f]"
_SCHEME_PATTERNS = {"s3": _S3, "pvc": _PVC, "path": r"/.*"}
_SCHEME_WORDS = {"s3": "s3://bucket/key", "pvc": "pvc://claim/path", "path": "an absolute path"}


def storage_uri(field_name: str, schemes: tuple[Literal["s3", "pvc", "path"], ...]) -> CelRule:
    """A rule that `field_name` is a location in one of `schemes` with no `..` segment."""
    pattern = "^(" + "|".join(_SCHEME_PATTERNS[s] for s in schemes) + ")$"
    words = ", ".join(_SCHEME_WORDS[s] for s in schemes[:-1])
    words = f"{words} or {_SCHEME_WORDS[schemes[-1]]}" if words else _SCHEME_WORDS[schemes[-1]]
    compiled, dot_dot, unnormalised = re.compile(pattern), re.compile(_DOT_DOT), re.compile(_UNNORMALISED)
    return CelRule(
        f"self.matches({_cel_string(pattern)}) && !self.matches({_cel_string(_DOT_DOT)})"
        f" && !self.matches({_cel_string(_UNNORMALISED)})",
        f"{field_name} must be {words} (without '..' segments), normalised: no empty or '.' segments, "
        "no percent-encoded '.', '/', '\\' or NUL, no control characters",
        # fullmatch: Python's `$` also matches before a trailing newline, RE2's does not.
        check=lambda uri: (
            compiled.fullmatch(uri) is not None
            and dot_dot.search(uri) is None
            and unnormalised.search(uri) is None
        ),
    )


def object_name_rule(kind: str, max_length: int, why: str) -> CelRule:
    """A root rule: metadata.name is a DNS-1035 label of at most `max_length` characters, because the
    operator names children after it (`why`)."""
    label = re.compile(DNS_LABEL)
    return CelRule(
        f"!has(self.metadata.name) || (size(self.metadata.name) <= {max_length}"
        f" && self.metadata.name.matches({_cel_string(DNS_LABEL)}))",
        f"metadata.name of a {kind} must be a DNS label of at most {max_length} characters (lower-case "
        f"letters, digits and '-', starting with a letter): {why}",
        check=lambda obj: (
            obj.metadata.name is None
            or (len(obj.metadata.name) <= max_length and label.fullmatch(obj.metadata.name) is not None)
        ),
    )


def _cel_string(text: str) -> str:
    """`text` as a CEL raw string literal, so regex backslashes need no second escaping."""
    if "'" in text:
        raise ValueError(f"pattern {text!r} contains a quote")
    return f"r'{text}'"


def _add_class_rules(schema: dict[str, Any], cls: type[Any]) -> None:
    rules: tuple[CelRule, ...] = getattr(cls, "cel_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_crd() for rule in rules]


class ApiModel(BaseModel):
    """Base of every spec/status model: snake_case in Python, camelCase on the wire (the Kubernetes
    convention), unknown fields rejected (a typo must not silently fall back to a default)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        json_schema_extra=_add_class_rules,
    )

    # Object-level rules; `self` is the whole object. Checked in Python after field validation.
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Self:
        for rule in self.cel_rules:
            rule.validate(self)
        return self


def section(model: type[ApiModel], description: str) -> Any:
    """A nested spec section that is always present, filled with its defaults when omitted.

    The schema default is the section's complete default object, not `{}`: the apiserver checks a default
    against the section's CEL rules as written, before nested defaults apply, so `{}` would fail
    `self.clipLow <= self.clipHigh` with "no such key".
    """
    default = model().model_dump(mode="json", by_alias=True, exclude_none=True)
    return Field(default_factory=model, description=description, json_schema_extra={"default": default})


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """One aspect of the object's state, in the shape of metav1.Condition so `kubectl wait
    --for=condition=Ready` and generic tooling understand it."""

    type: Annotated[
        str,
        Field(
            max_length=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
            description="Type of condition in CamelCase, e.g. Ready, Progressing, Succeeded, Failed.",
        ),
    ]
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: StrictInt | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this condition was computed from."
    )
    last_transition_time: datetime = Field(description="When the status last changed.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="Programmatic CamelCase identifier of the cause of the last transition.",
    )
    message: str = Field(
        default="", max_length=32768, description="Human-readable details of the transition."
    )


def conditions_field() -> Any:
    """`status.conditions`: a list keyed by `type`, so server-side apply merges one condition at a time."""
    return Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Current conditions of the object, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class ObjectMeta(BaseModel):
    """The part of metav1.ObjectMeta the platform reads; other fields the apiserver adds are kept as-is."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: str | None = Field(default=None, max_length=MAX_NAME, pattern=DNS_SUBDOMAIN)
    generate_name: str | None = None
    namespace: str | None = Field(default=None, max_length=63)
    labels: dict[str, str] = Field(default_factory=dict, exclude_if=lambda v: not v)
    annotations: dict[str, str] = Field(default_factory=dict, exclude_if=lambda v: not v)
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None


@dataclass(frozen=True)
class PrinterColumn:
    """A column of `kubectl get`; priority 1 columns appear only with `-o wide`."""

    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    description: str
    priority: int = 0
    format: str | None = None


@dataclass(frozen=True)
class ScaleSubresource:
    """Paths of the `/scale` subresource (used by `kubectl scale` and autoscalers)."""

    spec_replicas_path: str
    status_replicas_path: str
    label_selector_path: str | None = None


class CustomResource(ApiModel):
    """Base of the full objects (apiVersion/kind/metadata/spec/status). Class variables describe the
    resource to the CRD generator; subclasses declare `api_version`, `kind`, `spec` and `status`."""

    plural: ClassVar[str]
    singular: ClassVar[str]
    short_names: ClassVar[tuple[str, ...]]
    categories: ClassVar[tuple[str, ...]] = ("cuda-agent",)
    printer_columns: ClassVar[tuple[PrinterColumn, ...]]
    scale: ClassVar[ScaleSubresource | None] = None

    # Subclasses narrow these two to Literals; declared here so manifests start with them.
    api_version: str = Field(description="API version.")
    kind: str = Field(description="Kind of the object.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")

    def to_manifest(self) -> dict[str, Any]:
        """The object as the apiserver accepts it: camelCase keys, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

"""crds/ and the docs reference are what the models generate, and what they generate is a CRD the
apiserver accepts: structural, CEL-costable, with the names, columns and subresources the docs promise."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cuda_agent.api import PpoAlgorithm, crdgen

REPO = Path(__file__).resolve().parents[2]
RENDERED = crdgen.render_crds()
CRDS = {name: yaml.safe_load(text) for name, text in RENDERED.items()}


def schema_of(crd_name: str) -> dict[str, Any]:
    schema: dict[str, Any] = CRDS[f"{crd_name}.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def nodes(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from nodes(schema["additionalProperties"], f"{path}.*")
    if "items" in schema:
        yield from nodes(schema["items"], f"{path}[]")


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_committed_crd_matches_the_models(name: str) -> None:
    path = REPO / "crds" / name
    assert path.is_file(), f"{path} is missing: run `make crds`"
    assert path.read_text(encoding="utf-8") == RENDERED[name], f"{path} is stale: run `make crds`"


def test_crds_directory_has_no_leftover_files() -> None:
    assert sorted(p.name for p in (REPO / "crds").glob("*.yaml")) == sorted(RENDERED), "run `make crds`"


def test_docs_reference_matches_the_models() -> None:
    docs = REPO / "docs" / "api.md"
    text = docs.read_text(encoding="utf-8")
    assert crdgen.refresh_docs(text) == text, f"the generated reference in {docs} is stale: run `make crds`"


def test_generation_is_deterministic() -> None:
    assert crdgen.render_crds() == RENDERED


def test_check_mode_reports_stale_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = tmp_path / "api.md"
    docs.write_text(f"intro\n{crdgen.DOCS_BEGIN}\nold\n{crdgen.DOCS_END}\n", encoding="utf-8")
    args = ["--out", str(tmp_path / "crds"), "--docs", str(docs)]
    assert crdgen.main([*args, "--check"]) == 1
    assert "run `make crds`" in capsys.readouterr().err
    assert crdgen.main(args) == 0
    assert crdgen.main([*args, "--check"]) == 0
    assert docs.read_text(encoding="utf-8").startswith("intro\n") and "clipLow" in docs.read_text(
        encoding="utf-8"
    )


@pytest.mark.parametrize("crd_name", ["trainingruns.cuda-agent.io", "sandboxpools.cuda-agent.io"])
def test_schema_is_structural(crd_name: str) -> None:
    """The apiserver's structural-schema rules that pydantic's JSON schema would otherwise break."""
    for path, node in nodes(schema_of(crd_name)):
        assert "type" in node, f"{path} has no type"
        for keyword in ("$ref", "anyOf", "allOf", "oneOf", "const", "title", "uniqueItems"):
            assert keyword not in node, f"{path} uses {keyword}"
        assert node.get("additionalProperties") is not False, f"{path} sets additionalProperties: false"
        assert not ("properties" in node and "additionalProperties" in node), f"{path} has both"
        assert not isinstance(node.get("exclusiveMinimum"), int | float) or isinstance(
            node["exclusiveMinimum"], bool
        ), f"{path}: OpenAPI 3.0 wants a boolean exclusiveMinimum"
    assert schema_of(crd_name)["properties"]["metadata"] == {"type": "object"}


@pytest.mark.parametrize("crd_name", ["trainingruns.cuda-agent.io", "sandboxpools.cuda-agent.io"])
def test_everything_cel_can_reach_is_bounded(crd_name: str) -> None:
    """Kubernetes costs a CEL rule by its worst-case input: unbounded strings or lists under a rule
    make the apiserver refuse the CRD."""
    for path, node in nodes(schema_of(crd_name)["properties"]["spec"], "spec"):
        if node["type"] == "string" and "enum" not in node:
            assert "maxLength" in node, f"{path} has no maxLength"
        if node["type"] == "array":
            assert "maxItems" in node, f"{path} has no maxItems"


def test_cel_rules_name_their_field() -> None:
    for crd_name in ("trainingruns.cuda-agent.io", "sandboxpools.cuda-agent.io"):
        for path, node in nodes(schema_of(crd_name)):
            for rule in node.get("x-kubernetes-validations", []):
                assert set(rule) <= {"rule", "message", "fieldPath", "reason"}
                assert rule["message"].startswith(path), (
                    f"{path}: message {rule['message']!r} names another field"
                )


def rules_at(crd_name: str, path: str) -> list[str]:
    return [
        r["rule"]
        for p, node in nodes(schema_of(crd_name))
        if p == path
        for r in node["x-kubernetes-validations"]
    ]


def test_expected_rules_are_declared() -> None:
    assert rules_at("trainingruns.cuda-agent.io", "spec.model") == ["self == oldSelf"]
    assert rules_at("trainingruns.cuda-agent.io", "spec.reward") == ["self == oldSelf"]
    assert rules_at("trainingruns.cuda-agent.io", "spec.algorithm") == ["self.clipLow <= self.clipHigh"]
    assert rules_at("sandboxpools.cuda-agent.io", "spec.gpu.resourceName") == ["self == oldSelf"]
    assert rules_at("sandboxpools.cuda-agent.io", "spec.autoscaling") == [
        "self.minReplicas <= self.maxReplicas"
    ]


def test_defaults_and_bounds_reach_the_schema() -> None:
    algorithm = schema_of("trainingruns.cuda-agent.io")["properties"]["spec"]["properties"]["algorithm"]
    # A section's default is its complete default object: the apiserver checks it against the section's
    # CEL rules before nested defaults apply.
    assert algorithm["default"] == PpoAlgorithm().model_dump(mode="json", by_alias=True)
    clip_low = algorithm["properties"]["clipLow"]
    assert (clip_low["default"], clip_low["minimum"], clip_low["exclusiveMinimum"]) == (0.2, 0, True)
    assert algorithm["properties"]["name"]["enum"] == ["ppo"]
    precision = schema_of("trainingruns.cuda-agent.io")["properties"]["spec"]["properties"]["reward"][
        "properties"
    ]
    assert precision["precision"]["enum"] == ["strict-fp32", "tf32"]
    assert "critic" not in algorithm.get("required", [])


def test_names_columns_and_subresources() -> None:
    run = CRDS["trainingruns.cuda-agent.io.yaml"]["spec"]
    pool = CRDS["sandboxpools.cuda-agent.io.yaml"]["spec"]
    assert (run["names"]["shortNames"], pool["names"]["shortNames"]) == (["tr"], ["sp"])
    assert run["names"]["categories"] == pool["names"]["categories"] == ["cuda-agent"]
    assert run["scope"] == pool["scope"] == "Namespaced"

    def columns(spec: Mapping[str, Any]) -> list[str]:
        return [c["name"] for c in spec["versions"][0]["additionalPrinterColumns"] if "priority" not in c]

    assert columns(run) == ["Phase", "Step", "Reward", "Pass Rate", "Age"]
    assert columns(pool) == ["Ready", "Desired", "Queue", "Sessions", "Age"]
    assert run["versions"][0]["subresources"] == {"status": {}}
    assert pool["versions"][0]["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_unsupported_schemas_are_refused() -> None:
    from pydantic import BaseModel

    class Ambiguous(BaseModel):
        value: int | str

    with pytest.raises(crdgen.SchemaError, match=r"Ambiguous.value: a union of 2 types is not structural"):
        crdgen.structural_schema(Ambiguous)

"""The ksquad.io CustomResourceDefinitions, generated from the pydantic models.

    python -m crd_bridge.crds > charts/ksquad/crds/ksquad.io.yaml

pydantic's JSON Schema becomes a Kubernetes structural schema: references inlined, `Optional` as
`nullable`, no `additionalProperties: false` (the API server prunes unknown fields instead), and the
cross-field rules the models check in Python as CEL validations. tests/crd_bridge/test_crds.py fails when the
committed file and the models drift apart.
"""

import copy
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel

from crd_bridge.resources import (
    AgentSpec,
    MCPServerSpec,
    ModelEndpointSpec,
    ProjectSpec,
    SkillSpec,
    TeamSpec,
    ToolResourceSpec,
)
from workflows.spec import MAX_INPUTS_BYTES, RunSpec
from workflows.status import RunStatus

GROUP = "ksquad.io"
VERSION = "v1alpha1"
Schema = dict[str, Any]

_DROP = {"title", "additionalProperties", "$defs", "examples"}


def structural(model: type[BaseModel]) -> Schema:
    """The model's JSON Schema (camelCase, as on the wire) as a Kubernetes structural schema."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    converted: Schema = _convert(schema, schema.get("$defs", {}))
    return converted


def _convert(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_convert(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) != 1:
            raise ValueError(f"unions other than Optional are not structural: {node}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        converted = _convert({**options[0], **rest}, defs)
        if nullable:
            converted["nullable"] = True
        if converted.get("default", ...) is None:
            del converted["default"]  # a null default is no default
        return converted
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP and not (key == "additionalProperties" and isinstance(value, dict)):
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "propertyNames":
            # Not structural: a map's key constraints become a CEL rule over its keys.
            out.setdefault("x-kubernetes-validations", []).append(_key_rule(value))
            continue
        if key == "patternProperties":
            # Neither: one pattern's values are the map's values, and the pattern a rule over its keys.
            ((pattern, values),) = value.items()
            out["additionalProperties"] = _convert(values, defs)
            out.setdefault("x-kubernetes-validations", []).append(_key_rule({"pattern": pattern}))
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020 (pydantic's gt/lt) puts the bound here; Kubernetes' OpenAPI v3 wants the
            # bound in minimum/maximum and a boolean here.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
            continue
        out[key] = _convert(value, defs) if key in ("properties", "items", "additionalProperties") else value
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _key_rule(names: Schema) -> Schema:
    checks = []
    if "maxLength" in names:
        checks.append(f"size(k) <= {names['maxLength']}")
    if "pattern" in names:
        checks.append(f"k.matches('{names['pattern']}')")
    limits = " and ".join(
        ([f"be at most {names['maxLength']} characters"] if "maxLength" in names else [])
        + ([f"match {names['pattern']}"] if "pattern" in names else [])
    )
    return {"rule": f"self.all(k, {' && '.join(checks) or 'true'})", "message": f"each key must {limits}"}


@dataclass
class Resource:
    kind: str
    plural: str
    short_names: list[str]
    spec: type[BaseModel]
    status: type[BaseModel] | None = None
    columns: list[Schema] = field(default_factory=list)
    spec_rules: list[Schema] = field(default_factory=list)
    rules_at: dict[str, list[Schema]] = field(default_factory=dict)  # property path -> CEL rules
    root_rules: list[Schema] = field(default_factory=list)  # CEL rules that see metadata.name


AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

RESOURCES = [
    Resource(
        "Run",
        "runs",
        ["kr"],
        RunSpec,
        RunStatus,
        columns=[
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Agent", "type": "string", "jsonPath": ".status.agent"},
            {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt"},
            # a string: kubectl prints a future `date` as <invalid>
            {"name": "Resume-At", "type": "string", "jsonPath": ".status.resumeAt"},
            AGE,
            {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
            {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
        ],
        spec_rules=[
            {
                "rule": "(has(self.agents) && size(self.agents) > 0) || has(self.teamRef)",
                "message": "name at least one agent in spec.agents, or a spec.teamRef whose agents run it",
            },
            {  # the running workflow was started with it: an edit would be silently ignored
                "rule": "self == oldSelf",
                "message": "spec cannot change once the Run exists: create another Run (delete this one to cancel it)",
            },
        ],
        root_rules=[
            {
                "rule": "size(self.metadata.name) <= 63",
                "message": "metadata.name: at most 63 characters (it labels the Run's sandboxes)",
            }
        ],
        rules_at={
            "inputs": [
                {
                    "rule": f"self.map(k, size(k) + size(self[k])).sum() <= {MAX_INPUTS_BYTES}",
                    "message": f"spec.inputs: more than {MAX_INPUTS_BYTES} characters in all (keys and values)",
                }
            ],
            "retryPolicy": [
                {
                    "rule": "!has(self.maxBackoffSeconds) || (has(self.backoffSeconds) ? self.backoffSeconds : 10)"
                    " <= self.maxBackoffSeconds",
                    "message": "maxBackoffSeconds must not be below backoffSeconds",
                }
            ],
        },
    ),
    Resource(
        "Agent",
        "agents",
        ["kagent"],
        AgentSpec,
        columns=[
            {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
            {"name": "Endpoint", "type": "string", "jsonPath": ".spec.modelEndpointRef"},
            AGE,
        ],
    ),
    Resource(
        "ModelEndpoint",
        "modelendpoints",
        ["kme"],
        ModelEndpointSpec,
        columns=[
            {"name": "URL", "type": "string", "jsonPath": ".spec.url"},
            {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
            AGE,
        ],
    ),
    Resource(
        "Tool",
        "tools",
        ["ktool"],
        ToolResourceSpec,
        columns=[
            {"name": "MCP-Server", "type": "string", "jsonPath": ".spec.mcpServerRef"},
            {"name": "Tool", "type": "string", "jsonPath": ".spec.toolName"},
            AGE,
        ],
    ),
    Resource(
        "MCPServer",
        "mcpservers",
        ["kmcp"],
        MCPServerSpec,
        columns=[{"name": "URL", "type": "string", "jsonPath": ".spec.url"}, AGE],
    ),
    Resource("Skill", "skills", ["kskill"], SkillSpec, columns=[AGE]),
    Resource(
        "Team",
        "teams",
        ["kteam"],
        TeamSpec,
        columns=[{"name": "Max-Runs", "type": "integer", "jsonPath": ".spec.maxConcurrentRuns"}, AGE],
    ),
    Resource(
        "Project",
        "projects",
        ["kproj"],
        ProjectSpec,
        columns=[{"name": "Max-Runs", "type": "integer", "jsonPath": ".spec.maxConcurrentRuns"}, AGE],
    ),
]


def crd(resource: Resource) -> Schema:
    spec = structural(resource.spec)
    if resource.spec_rules:
        spec["x-kubernetes-validations"] = resource.spec_rules
    for path, rules in resource.rules_at.items():
        spec["properties"][path]["x-kubernetes-validations"] = rules
    if "inputs" in spec["properties"]:  # bounds the cost of the rule that sums the inputs' sizes
        spec["properties"]["inputs"]["additionalProperties"]["maxLength"] = MAX_INPUTS_BYTES
    properties: Schema = {"spec": spec}
    version: Schema = {"name": VERSION, "served": True, "storage": True}
    if resource.status is not None:
        properties["status"] = structural(resource.status)
        version["subresources"] = {"status": {}}
        conditions = properties["status"]["properties"].get("conditions")
        if conditions is not None:  # as metav1.Condition lists are: one entry per type, merged by type
            conditions["x-kubernetes-list-type"] = "map"
            conditions["x-kubernetes-list-map-keys"] = ["type"]
    version["additionalPrinterColumns"] = resource.columns
    version["schema"] = {
        "openAPIV3Schema": {
            "type": "object",
            "description": " ".join((resource.spec.__doc__ or resource.kind).split()),
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                **properties,
            },
            "required": ["spec"],
            **({"x-kubernetes-validations": resource.root_rules} if resource.root_rules else {}),
        }
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{resource.plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "ksquad"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": resource.kind,
                "plural": resource.plural,
                "singular": resource.kind.lower(),
                "shortNames": resource.short_names,
                "categories": ["ksquad"],
            },
            "versions": [version],
        },
    }


def render() -> str:
    header = "# Generated by `python -m crd_bridge.crds` from the pydantic models: do not edit by hand.\n"
    return header + yaml.safe_dump_all([crd(r) for r in RESOURCES], sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render())

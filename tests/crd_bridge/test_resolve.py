"""Reference resolution: precedence, missing objects named, allowedTools enforced, scopes from Team/Project,
credentials only from labelled Secrets, the chart's allow-lists."""

from typing import Any

import pytest

from crd_bridge.resolve import AllowLists, resolve
from workflows.spec import parse_run_spec

OBJECTS: dict[tuple[str, str], dict[str, Any]] = {
    ("Agent", "dev-1"): {
        "model": "gpt-agent",
        "modelEndpointRef": "openai",
        "tools": ["notes"],
        "allowedTools": ["notes", "search"],
        "skillRefs": ["pytest"],
        "credentialSecretRef": {"name": "dev-1-key"},
        "fallbackModel": {"model": "gpt-small"},
        "systemPrompt": "You fix tests.",
    },
    ("Agent", "dev-2"): {"modelEndpointRef": "openai"},
    ("ModelEndpoint", "openai"): {
        "url": "https://api.example/v1",
        "model": "gpt-endpoint",
        "credentialSecretRef": {"name": "openai-key", "key": "token"},
    },
    ("ModelEndpoint", "local"): {"url": "http://127.0.0.1:1/v1", "model": "llama"},
    ("Tool", "notes"): {"mcpServerRef": "kb", "toolName": "add_note"},
    ("Tool", "search"): {"mcpServerRef": "kb", "toolName": "search"},
    ("MCPServer", "kb"): {"url": "http://kb.example/mcp"},
    ("Skill", "pytest"): {
        "instructions": "Run it three times.",
        "toolRefs": ["search"],
        "requires": {"toolchains": ["python"]},
    },
    ("Team", "payments-squad"): {"agents": ["dev-2", "dev-1"], "maxConcurrentRuns": 3, "weight": 3},
    ("Project", "payments-api"): {
        "maxConcurrentRuns": 10,
        "fallbackModel": {"model": "llama-project", "modelEndpointRef": "local"},
    },
    ("Secret", "dev-1-key"): {
        "labels": {"ksquad.io/credential": "true"},
        "annotations": {"ksquad.io/allowed-hosts": "api.example,127.0.0.1:1"},
    },
    ("Secret", "openai-key"): {
        "labels": {"ksquad.io/credential": "true", "team": "payments"},
        "annotations": {"ksquad.io/allowed-hosts": "api.example:443, 10.0.0.0/8"},
    },
}


def lookup(objects: dict[tuple[str, str], dict[str, Any]]) -> Any:
    async def get(kind: str, name: str) -> dict[str, Any] | None:
        return objects.get((kind, name))

    return get


async def test_run_overrides_beat_agent_defaults_and_the_agents_credential_wins() -> None:
    r = await resolve(
        "payments",
        parse_run_spec(
            {"agents": ["dev-1", "dev-2"], "teamRef": "payments-squad", "projectRef": "payments-api"}
        ),
        lookup(OBJECTS),
    )
    assert r.outcome == "resolved"
    dev1, dev2 = r.agents
    assert (dev1.model.name, dev1.model.url) == ("gpt-agent", "https://api.example/v1")
    assert dev1.model.credential is not None
    assert dev1.model.credential.secret_name == "dev-1-key", "the Agent's own credential beats the endpoint's"
    assert dev1.fallback_model is not None
    assert (dev1.fallback_model.name, dev1.fallback_model.url) == ("gpt-small", "https://api.example/v1")
    project_fallback = (dev1.project_fallback_model, dev2.project_fallback_model)
    assert [(m.name, m.url) for m in project_fallback if m] == [
        ("llama-project", "http://127.0.0.1:1/v1")
    ] * 2
    assert dev1.project_fallback_model is not None and dev1.project_fallback_model.credential is not None
    assert dev1.project_fallback_model.credential.allowed_hosts, "checked like the agent's own models"
    assert [t.tool_name for t in dev1.tools] == ["add_note", "search"], "its tools and its skills' tools"
    assert dev1.skills[0].requires.toolchains == ["python"]
    assert dev1.forces_cold
    assert (dev2.model.name, dev2.model.credential.key if dev2.model.credential else None) == (
        "gpt-endpoint",
        "token",
    )
    assert [(s.key, s.limit) for s in r.scopes] == [
        ("team/payments/payments-squad", 3),
        ("project/payments/payments-api", 10),
    ]
    assert (r.share.tenant, r.share.weight) == ("team/payments-squad", 3), "the Team's share where runs wait"

    overridden = await resolve(
        "payments",
        parse_run_spec({"agents": ["dev-1"], "model": "gpt-run", "modelEndpointRef": "local"}),
        lookup(OBJECTS),
    )
    model = overridden.agents[0].model
    assert (model.name, model.url, model.endpoint_ref) == ("gpt-run", "http://127.0.0.1:1/v1", "local")
    assert (overridden.share.tenant, overridden.share.weight) == ("", 1), (
        "no Team: the namespace's one tenant"
    )


async def test_an_empty_agent_list_means_the_teams_agents() -> None:
    r = await resolve("payments", parse_run_spec({"teamRef": "payments-squad"}), lookup(OBJECTS))
    assert [a.name for a in r.agents] == ["dev-2", "dev-1"]


async def test_missing_objects_are_all_named() -> None:
    gone = {("Skill", "pytest"), ("MCPServer", "kb"), ("Secret", "dev-1-key")}
    objects = {k: v for k, v in OBJECTS.items() if k not in gone}
    r = await resolve(
        "payments", parse_run_spec({"agents": ["dev-1", "ghost"], "teamRef": "nobody"}), lookup(objects)
    )
    assert r.outcome == "missing"
    assert r.missing == [
        "Team payments/nobody",
        "Skill payments/pytest",
        "MCPServer payments/kb",
        "Secret payments/dev-1-key",
        "Agent payments/ghost",
    ]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {("Agent", "dev-1"): {**OBJECTS[("Agent", "dev-1")], "allowedTools": ["notes"]}},
            "uses tool(s) search outside its allowedTools (notes)",
        ),
        ({("Agent", "dev-1"): {"model": "x"}}, "has no modelEndpointRef"),
        (
            {("ModelEndpoint", "openai"): {"url": "ftp://nope"}},
            "ModelEndpoint payments/openai is invalid: spec.url",
        ),
        (
            {("Secret", "dev-1-key"): {"labels": {"app": "payments"}}},
            "Secret payments/dev-1-key is not labelled ksquad.io/credential=true",
        ),
    ],
)
async def test_runs_that_can_never_work_are_invalid_with_the_reason(
    change: dict[Any, Any], words: str
) -> None:
    r = await resolve("payments", parse_run_spec({"agents": ["dev-1"]}), lookup({**OBJECTS, **change}))
    assert r.outcome == "invalid"
    assert words in (r.error or "")


@pytest.mark.parametrize(
    ("spec", "agent", "words"),
    [
        (
            {"sandboxPolicy": {"runtimeClass": "runc"}},
            {},
            "spec.sandboxPolicy.runtimeClass runc is not allowed here",
        ),
        ({}, {"image": "docker.io/attacker/agent:1"}, "image docker.io/attacker/agent:1 is not allowed here"),
        ({}, {"endpoint": "http://10.0.0.1:443/"}, "endpoint http://10.0.0.1:443/ is not allowed here"),
        (
            {},
            {"endpoint": "http://metadata.internal/"},
            "endpoint http://metadata.internal/ is not allowed here",
        ),
    ],
)
async def test_what_the_chart_does_not_allow_makes_the_run_invalid(
    spec: dict[str, Any], agent: dict[str, Any], words: str
) -> None:
    allow = AllowLists(
        images=frozenset({"ghcr.io/ksquad/ksquad-agent:0.1.0"}),
        runtime_classes=frozenset({"gvisor"}),
        endpoints=frozenset({"agents.example.com", "10.20.0.0/16"}),
    )
    objects = {**OBJECTS, ("Agent", "dev-2"): {**OBJECTS[("Agent", "dev-2")], **agent}}
    r = await resolve("payments", parse_run_spec({"agents": ["dev-2"], **spec}), lookup(objects), allow=allow)
    assert r.outcome == "invalid"
    assert words in (r.error or "")


async def test_endpoints_inside_the_allow_list_resolve() -> None:
    allow = AllowLists(endpoints=frozenset({"agents.example.com", "10.20.0.0/16", "a2a.example.com:8443"}))
    for endpoint in (
        "https://agents.example.com/a2a",
        "http://10.20.3.4:8080/",
        "https://a2a.example.com:8443/",
    ):
        objects = {**OBJECTS, ("Agent", "dev-2"): {**OBJECTS[("Agent", "dev-2")], "endpoint": endpoint}}
        r = await resolve("payments", parse_run_spec({"agents": ["dev-2"]}), lookup(objects), allow=allow)
        assert r.outcome == "resolved", (endpoint, r.error)
    denied = {
        **OBJECTS,
        ("Agent", "dev-2"): {**OBJECTS[("Agent", "dev-2")], "endpoint": "https://a2a.example.com/"},
    }
    r = await resolve("payments", parse_run_spec({"agents": ["dev-2"]}), lookup(denied), allow=allow)
    assert r.outcome == "invalid", "a host allowed on one port only"


async def test_an_agents_model_endpoint_created_after_the_run_is_waited_for_not_invalid() -> None:
    # An Agent with modelEndpointRef and no model, its endpoint not there yet: the Run was Invalid at once
    # ("no model for Agent ..."), and stayed Failed after the endpoint appeared.
    objects = {("Agent", "later"): {"modelEndpointRef": "late-endpoint"}}
    spec = parse_run_spec({"agents": ["later"]})
    waiting = await resolve("payments", spec, lookup(objects))
    assert (waiting.outcome, waiting.missing) == ("missing", ["ModelEndpoint payments/late-endpoint"])
    objects[("ModelEndpoint", "late-endpoint")] = {"url": "https://api.example/v1", "model": "gpt-late"}
    resolved = await resolve("payments", spec, lookup(objects))
    assert resolved.outcome == "resolved"
    assert resolved.agents[0].model.name == "gpt-late"


@pytest.mark.parametrize(
    ("annotation", "refusal"),
    [
        (
            None,
            "Secret payments/openai-key names no host its value may be sent to, and ModelEndpoint "
            "payments/mine would send it to listener.attacker.example:8443: its owner lists the hosts in the "
            "annotation ksquad.io/allowed-hosts",
        ),
        (
            "api.example",
            "Secret payments/openai-key may be sent only to api.example (its annotation "
            "ksquad.io/allowed-hosts), not to listener.attacker.example:8443 (ModelEndpoint payments/mine)",
        ),
        ("listener.attacker.example:443", "may be sent only to listener.attacker.example:443"),
        ("10.0.0.0/8", "may be sent only to 10.0.0.0/8"),
    ],
)
async def test_a_credential_goes_only_to_the_hosts_its_secrets_owner_names(
    annotation: str | None, refusal: str
) -> None:
    objects = {
        **OBJECTS,
        ("ModelEndpoint", "mine"): {
            "url": "https://listener.attacker.example:8443/v1",
            "model": "m",
            "credentialSecretRef": {"name": "openai-key", "key": "token"},
        },
        ("Agent", "thief"): {"modelEndpointRef": "mine"},
        ("Secret", "openai-key"): {
            "labels": {"ksquad.io/credential": "true"},
            "annotations": {"ksquad.io/allowed-hosts": annotation} if annotation else {},
        },
    }
    r = await resolve("payments", parse_run_spec({"agents": ["thief"]}), lookup(objects))
    assert r.outcome == "invalid" and r.error is not None and refusal in r.error, r.error


@pytest.mark.parametrize(
    "allowed",
    ["listener.attacker.example", "listener.attacker.example:8443", "LISTENER.attacker.example"],
)
async def test_the_hosts_a_credential_may_go_to_travel_with_it(allowed: str) -> None:
    objects = {
        **OBJECTS,
        ("ModelEndpoint", "theirs"): {
            "url": "https://listener.attacker.example:8443/v1",
            "model": "m",
            "credentialSecretRef": {"name": "openai-key", "key": "token"},
        },
        ("Agent", "owner-approved"): {"modelEndpointRef": "theirs"},
        ("Secret", "openai-key"): {
            "labels": {"ksquad.io/credential": "true"},
            "annotations": {"ksquad.io/allowed-hosts": f"{allowed}, api.example"},
        },
    }
    r = await resolve("payments", parse_run_spec({"agents": ["owner-approved"]}), lookup(objects))
    assert r.outcome == "resolved", r.error
    credential = r.agents[0].model.credential
    assert credential is not None and credential.allowed_hosts == [allowed, "api.example"]


async def test_a_run_author_cannot_send_the_agents_credential_to_an_endpoint_of_theirs() -> None:
    """The Run's modelEndpointRef beats the Agent's, and the Agent's credential goes with the model: the
    override may not take the key where its owner did not send it."""
    objects = {**OBJECTS, ("ModelEndpoint", "mine"): {"url": "http://203.0.113.7/v1", "model": "m"}}
    spec = parse_run_spec({"agents": ["dev-1"], "modelEndpointRef": "mine"})
    r = await resolve("payments", spec, lookup(objects))
    assert r.outcome == "invalid" and r.error is not None
    assert "Secret payments/dev-1-key may be sent only to api.example, 127.0.0.1:1" in r.error, r.error
    assert "not to 203.0.113.7 (ModelEndpoint payments/mine)" in r.error


PLACED = AllowLists(
    service_accounts=frozenset({"gpu-runner"}),
    priority_classes=frozenset({"batch-high"}),
    toleration_keys=frozenset({"nvidia.com/gpu"}),
)
GPU_AGENT = {
    **OBJECTS[("Agent", "dev-2")],
    "placement": {
        "serviceAccountName": "gpu-runner",
        "nodeSelector": {"ksquad.io/pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    },
}


async def test_a_runs_placement_overrides_its_agents_field_by_field() -> None:
    objects = {**OBJECTS, ("Agent", "dev-2"): GPU_AGENT}
    spec = {
        "agents": ["dev-2"],
        "placement": {"nodeSelector": {"ksquad.io/pool": "gpu-big"}, "priorityClassName": "batch-high"},
    }
    r = await resolve("payments", parse_run_spec(spec), lookup(objects), allow=PLACED)
    assert r.outcome == "resolved", r.error
    placement = r.agents[0].placement
    assert placement is not None
    assert placement.node_selector == {"ksquad.io/pool": "gpu-big"}, "the Run's node selector wins"
    assert placement.priority_class_name == "batch-high"
    assert placement.service_account_name == "gpu-runner", "the Agent's, where the Run sets none"
    assert placement.resources is not None and placement.resources.limits == {"nvidia.com/gpu": "1"}
    plain = await resolve("payments", parse_run_spec({"agents": ["dev-1"]}), lookup(objects), allow=PLACED)
    assert plain.agents[0].placement is None, "no placement: the chart's defaults"


@pytest.mark.parametrize(
    ("placement", "words"),
    [
        (
            {"serviceAccountName": "cluster-admin-sa"},
            "placement.serviceAccountName cluster-admin-sa (Agent payments/dev-2, or the Run over it) is not "
            "allowed here (chart value sandbox.allowedServiceAccounts: gpu-runner)",
        ),
        (
            {"priorityClassName": "system-node-critical"},
            "chart value sandbox.allowedPriorityClasses: batch-high",
        ),
        (
            {"tolerations": [{"operator": "Exists"}]},
            "placement.tolerations (no key: every taint) (Agent payments/dev-2, or the Run over it) not allowed "
            "here (chart value sandbox.allowedTolerations: nvidia.com/gpu)",
        ),
        (
            {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]},
            "placement.tolerations node-role.kubernetes.io/control-plane",
        ),
    ],
)
async def test_a_placement_outside_the_charts_lists_makes_the_run_invalid(
    placement: dict[str, Any], words: str
) -> None:
    objects = {**OBJECTS, ("Agent", "dev-2"): GPU_AGENT}
    spec = parse_run_spec({"agents": ["dev-2"], "placement": placement})
    r = await resolve("payments", spec, lookup(objects), allow=PLACED)
    assert r.outcome == "invalid"
    assert words in (r.error or ""), r.error

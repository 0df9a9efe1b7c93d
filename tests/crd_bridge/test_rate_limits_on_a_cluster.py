"""Rate limits with two credentials, on the test cluster (the chart's bridge and worker, cold sandboxes running the
reference agent, the scripted model over HTTP, each ModelEndpoint with its own labelled Secret): a long limit
re-routes the run and stays on its credential; one 429 pauses every run on that credential and no other."""

import itertools
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from testbed.agents import MODEL_KEY, ModelEndpoint
from tests.crd_bridge.conftest import RUN_API, Stack, StackFactory


def two_credentials(model: ModelEndpoint) -> list[dict[str, Any]]:
    """Agents agent-a and agent-b, each on a ModelEndpoint of its own (models model-a, model-b) and a Secret of its
    own: two credentials, so two throttles."""
    docs: list[dict[str, Any]] = []
    for x in ("a", "b"):
        docs += [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": f"key-{x}",
                    "labels": {"ksquad.io/credential": "true"},
                    "annotations": {"ksquad.io/allowed-hosts": urlsplit(model.url).hostname or ""},
                },
                "stringData": {"apiKey": MODEL_KEY},
            },
            {
                "apiVersion": RUN_API,
                "kind": "ModelEndpoint",
                "metadata": {"name": f"endpoint-{x}"},
                "spec": {
                    "url": model.url,
                    "model": f"model-{x}",
                    "credentialSecretRef": {"name": f"key-{x}"},
                },
            },
            {
                "apiVersion": RUN_API,
                "kind": "Agent",
                "metadata": {"name": f"agent-{x}"},
                "spec": {"modelEndpointRef": f"endpoint-{x}"},
            },
        ]
    return docs


def run_doc(name: str, agents: list[str]) -> dict[str, Any]:
    return {"apiVersion": RUN_API, "kind": "Run", "metadata": {"name": name}, "spec": {"agents": agents}}


def calls_to(model: ModelEndpoint, name: str) -> list[Any]:
    return [c for c in model.state.calls if c.model == name]


async def reasons(stack: Stack, run: str) -> list[str]:
    events = await stack.kube.list(f"/api/v1/namespaces/{stack.namespace}/events")
    return [e["reason"] for e in events["items"] if e["involvedObject"]["name"] == run]


async def test_a_long_limit_reroutes_the_run_and_the_next_run_on_that_credential_pauses_without_calling(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("model-a", {"error": 429, "retry_after": "600"})
    model.script("model-b", {"text": "agent-b answered"})
    stack = await start_stack()
    stack.apply(*two_credentials(model), run_doc("moved", ["agent-a", "agent-b"]))
    moved = (await stack.wait_phase("moved", {"Succeeded", "Failed"}))["status"]
    assert (moved["phase"], moved["agent"], moved["message"]) == ("Succeeded", "agent-b", "agent-b answered")
    assert "Rerouted" in await reasons(stack, "moved")
    (limited,) = calls_to(model, "model-a")

    stack.apply(run_doc("after", ["agent-a"]))
    after = (await stack.wait_phase("after", {"Paused", "Running", "Succeeded", "Failed"}))["status"]
    assert (after["phase"], after["pauseReason"]) == ("Paused", "RateLimited"), after
    waits = datetime.fromisoformat(after["resumeAt"]).timestamp() - limited.at
    assert 595 <= waits <= 605, "the provider's 600 s, not now: the re-route left the limit on the credential"
    assert len(calls_to(model, "model-a")) == 1, "no call to the provider that said 600 s"


async def test_one_429_pauses_both_runs_on_its_credential_while_a_run_on_another_goes_on(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    # One of the two runs on key-a gets a 429 after 3 s; the other is still waiting on its own call: it stops
    # and pauses too. The run on key-b is not touched.
    # The limit outlasts b1's whole run (a cold sandbox on runc starts in a few seconds here, the model takes 2).
    limit = 20
    model.script(
        "model-a",
        {"delay": 3, "error": 429, "retry_after": str(limit)},
        {"delay": 10, "text": "too late: stopped by the other's 429"},
        {"text": "agent-a answered"},
    )
    model.script("model-b", {"delay": 2, "text": "agent-b answered"})
    stack = await start_stack()
    stack.apply(*two_credentials(model), run_doc("a1", ["agent-a"]), run_doc("a2", ["agent-a"]))
    for name in ("a1", "a2"):
        paused = (await stack.wait_phase(name, {"Paused", "Succeeded", "Failed"}))["status"]
        assert (paused["phase"], paused["pauseReason"]) == ("Paused", "RateLimited"), (name, paused)
    stack.apply(run_doc("b1", ["agent-b"]))
    b1 = (await stack.wait_phase("b1", {"Succeeded", "Failed"}))["status"]
    assert b1["phase"] == "Succeeded"
    for name in ("a1", "a2"):
        assert (await stack.run(name))["status"]["phase"] == "Paused", (
            "the other credential's run went on alone"
        )
    for name in ("a1", "a2"):
        done = (await stack.wait_phase(name, {"Succeeded", "Failed"}, within=120))["status"]
        assert (done["phase"], done["message"]) == ("Succeeded", "agent-a answered"), done
    first_429 = calls_to(model, "model-a")[0].at + 3
    resumed = sorted(c.at for c in calls_to(model, "model-a"))[2:]
    assert len(resumed) == 2 and all(at >= first_429 + limit - 1 for at in resumed), (
        "no call before the limit ended"
    )


async def test_three_short_limits_in_a_row_reroute_the_run_to_the_next_agent(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("model-a", {"error": 429, "retry_after": "1"})  # every call
    model.script("model-b", {"text": "agent-b answered"})
    stack = await start_stack()
    stack.apply(*two_credentials(model), run_doc("repeated", ["agent-a", "agent-b"]))
    done = (await stack.wait_phase("repeated", {"Succeeded", "Failed"}))["status"]
    assert (done["phase"], done["agent"], done["message"]) == ("Succeeded", "agent-b", "agent-b answered"), (
        done
    )
    assert "Rerouted" in await reasons(stack, "repeated")
    limited = sorted(c.at for c in calls_to(model, "model-a"))
    assert len(limited) == 3, "three limits in a row, then the next agent: no fourth call to model-a"
    assert all(later - earlier >= 1 - 0.05 for earlier, later in itertools.pairwise(limited)), (
        "each call waited for the previous Retry-After"
    )

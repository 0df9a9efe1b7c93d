"""Model usage on the installed chart: three Runs by two people (namespace editors, each creating Runs with their
own kubeconfig) on two credentials, the scripted model reporting usage as OpenAI does and counting what it
reported. Each Run's `status.usage`, the store's records, `ksquad usage` through ksquad-api and the worker's
Prometheus counters all agree exactly with the model's count; the failed first attempt of one Run is counted
once, beside its retry. A Run over its token budget ends Failed with the reason, its one call counted."""

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from store import utcnow
from testbed.agents import MODEL_KEY, ModelEndpoint
from tests.chart.conftest import API_URL, NS, Release, phase_of
from tests.chart.test_api import scrape, total
from tests.chart.test_items import editor
from tests.support.dev import ksquad

CREDENTIALS = {"a": "usage-key-a", "b": "usage-key-b"}


def endpoints(release: Release, model: ModelEndpoint) -> None:
    """Per credential: its Secret, a ModelEndpoint of its own model, and an Agent on it."""
    docs: list[dict[str, Any]] = []
    for which, secret in CREDENTIALS.items():
        docs += [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": secret,
                    "namespace": NS,
                    "labels": {"ksquad.io/credential": "true"},
                    "annotations": {"ksquad.io/allowed-hosts": urlsplit(model.url).hostname or ""},
                },
                "stringData": {"apiKey": MODEL_KEY},
            },
            {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "ModelEndpoint",
                "metadata": {"name": f"usage-{which}", "namespace": NS},
                "spec": {
                    "url": model.url,
                    "model": f"usage-{which}",
                    "credentialSecretRef": {"name": secret},
                },
            },
            {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "Agent",
                "metadata": {"name": f"usage-{which}-agent", "namespace": NS},
                "spec": {"modelEndpointRef": f"usage-{which}"},
            },
        ]
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def run_author(release: Release, name: str) -> Path:
    """A namespace editor who may also create Runs: the chart aggregates only workitems into `edit`, so Runs
    take a Role of their own (as docs/operating.md's trust table has it: `edit` on ksquad.io objects)."""
    _, kubeconfig = editor(release, name)
    verbs = "--verb=get,list,watch,create,patch,delete"
    release.kubectl("-n", NS, "create", "role", f"{name}-runs", verbs, "--resource=runs.ksquad.io")
    release.kubectl(
        "-n",
        NS,
        "create",
        "rolebinding",
        f"{name}-runs",
        f"--role={name}-runs",
        f"--serviceaccount={NS}:{name}",
    )
    return kubeconfig


def run_doc(name: str, which: str, **spec: Any) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "agents": [f"usage-{which}-agent"],
                "inputs": {"task": f"the task of {name}"},
                "retryPolicy": {"backoffSeconds": 1, "maxBackoffSeconds": 1},
                **spec,
            },
        }
    )


async def test_usage_of_two_people_on_two_credentials_agrees_everywhere_with_the_models_count(
    release: Release, model: ModelEndpoint, tmp_path: Any
) -> None:
    # usage-a: alice's first run answers at once; her second makes one call (a tool never offered), then the
    # model fails the attempt, and the retry answers. usage-b: bob's run answers at once.
    model.script(
        "usage-a",
        {"text": "first of alice"},
        {"tool_calls": [{"name": "not_offered", "arguments": {"why": "a call to count"}}]},
        {"error": 500},
        {"text": "retried and answered"},
    )
    model.script("usage-b", {"text": "bob's answer"})
    endpoints(release, model)
    alice, bob = run_author(release, "alice"), run_author(release, "bob")
    before = await asyncio.to_thread(scrape, release, "worker")
    started = utcnow() - timedelta(seconds=5)
    release.kubectl("--kubeconfig", str(alice), "apply", "-f", "-", input=run_doc("alice-1", "a"))
    await phase_of(release, "alice-1", {"Succeeded", "Failed"})  # one run at a time: the script is in order
    release.kubectl("--kubeconfig", str(alice), "apply", "-f", "-", input=run_doc("alice-2", "a"))
    release.kubectl("--kubeconfig", str(bob), "apply", "-f", "-", input=run_doc("bob-1", "b"))
    runs = {name: await phase_of(release, name, {"Succeeded", "Failed"}) for name in ("alice-2", "bob-1")}
    runs["alice-1"] = release.run("alice-1")
    assert {n: r["status"]["phase"] for n, r in runs.items()} == dict.fromkeys(runs, "Succeeded")
    assert runs["alice-2"]["status"]["attempt"] == 2

    people = {"alice": f"system:serviceaccount:{NS}:alice", "bob": f"system:serviceaccount:{NS}:bob"}
    served = {
        name: [c for c in model.state.calls if f"the task of {name}" in c.task and c.output_tokens]
        for name in runs
    }
    assert [len(served[n]) for n in ("alice-1", "alice-2", "bob-1")] == [1, 2, 1], "the 500 reported nothing"
    for name, run in runs.items():
        counted = {
            "calls": len(served[name]),
            "inputTokens": sum(c.input_tokens for c in served[name]),
            "outputTokens": sum(c.output_tokens for c in served[name]),
        }
        assert run["status"]["usage"] == counted, name
        assert run["status"]["triggeredBy"] == people[name.split("-")[0]]
        stored = await release.store.run_usage(run["metadata"]["uid"])
        assert (stored.calls, stored.input_tokens, stored.output_tokens) == tuple(counted.values()), name
    first, second = [
        await release.store.run_usage(runs["alice-2"]["metadata"]["uid"], attempt) for attempt in (1, 2)
    ]
    assert (first.calls, second.calls) == (1, 1), "the failed attempt's call once, the retry's once"

    def tokens(names: list[str], direction: str) -> int:
        return sum(getattr(c, f"{direction}_tokens") for n in names for c in served[n])

    # ksquad usage, through ksquad-api as alice (an editor may list Runs in the namespace).
    cli = (
        "-n",
        NS,
        "--kubeconfig",
        str(alice),
        "--api",
        API_URL,
        "-o",
        "json",
        "--since",
        started.isoformat(),
    )
    by_credential = await ksquad(tmp_path, "usage", "--by", "credential", *cli)
    assert by_credential.code == 0, by_credential.err
    # Other tests' runs share the namespace (and may still be calling): only these credentials and people.
    mine = {f"{NS}/{secret}" for secret in CREDENTIALS.values()}
    found = {
        u["credential"]: u for u in yaml.safe_load(by_credential.out)["items"] if u["credential"] in mine
    }
    assert {k: (u["calls"], u["inputTokens"], u["outputTokens"]) for k, u in found.items()} == {
        f"{NS}/{CREDENTIALS['a']}": (
            3,
            tokens(["alice-1", "alice-2"], "input"),
            tokens(["alice-1", "alice-2"], "output"),
        ),
        f"{NS}/{CREDENTIALS['b']}": (1, tokens(["bob-1"], "input"), tokens(["bob-1"], "output")),
    }
    by_person = await ksquad(tmp_path, "usage", "--by", "person", *cli)
    found = {u["person"]: u for u in yaml.safe_load(by_person.out)["items"] if u["person"] in people.values()}
    assert {k: (u["calls"], u["inputTokens"]) for k, u in found.items()} == {
        people["alice"]: (3, tokens(["alice-1", "alice-2"], "input")),
        people["bob"]: (1, tokens(["bob-1"], "input")),
    }
    everywhere = await ksquad(tmp_path, "usage", "-A", "--kubeconfig", str(alice), "--api", API_URL)
    assert everywhere.code == 1 and "may not list runs.ksquad.io cluster-wide" in everywhere.err, (
        everywhere.err
    )

    # The worker's counters, by credential and person.
    after = await asyncio.to_thread(scrape, release, "worker")
    for person, names, credential in (
        ("alice", ["alice-1", "alice-2"], CREDENTIALS["a"]),
        ("bob", ["bob-1"], CREDENTIALS["b"]),
    ):
        labels = {"namespace": NS, "credential": f"{NS}/{credential}", "user": people[person]}
        for direction in ("input", "output"):
            metric = total(after, "ksquad_model_tokens_total", direction=direction, **labels) - total(
                before, "ksquad_model_tokens_total", direction=direction, **labels
            )
            assert metric == tokens(names, direction), (person, direction)
        calls = total(after, "ksquad_model_calls_total", **labels) - total(
            before, "ksquad_model_calls_total", **labels
        )
        assert calls == sum(len(served[n]) for n in names), person

    # A budget of one token: the first call passes it, and the run ends there.
    model.script("usage-b", {"tool_calls": [{"name": "not_offered", "arguments": {"why": "more"}}]})
    release.kubectl(
        "--kubeconfig", str(bob), "apply", "-f", "-", input=run_doc("bob-frugal", "b", tokenBudget=1)
    )
    frugal = (await phase_of(release, "bob-frugal", {"Succeeded", "Failed"}))["status"]
    assert (frugal["phase"], frugal["reason"], frugal["attempt"]) == ("Failed", "TokenBudgetSpent", 1), frugal
    [call] = [c for c in model.state.calls if "the task of bob-frugal" in c.task]
    assert frugal["usage"] == {
        "calls": 1,
        "inputTokens": call.input_tokens,
        "outputTokens": call.output_tokens,
    }

"""ksquad-api on the installed chart, as operators and users meet it: `ksquad runs watch --kubeconfig` streams a
Run's phases and agent progress through it and resumes when its pod is replaced, without repeating or losing
an event; its events and artifacts are for whoever Kubernetes RBAC lets get the Run; the Temporal UI (Debian's
Chromium) shows decoded inputs, results and summaries through its codec endpoint, which refuses callers without
credentials; a codec key rotated while a run is paused leaves every history readable; and /metrics of the
worker, the bridges and the API count what happened.

Runs here use an Agent and ModelEndpoint of their own (api-agent, api-endpoint), so test_install.py's seed
steps stay as the README has them.
"""

import asyncio
import base64
import json
import os
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message
from playwright.async_api import Page
from temporalio.api.common.v1 import Payloads

from dev.devserver import DevServer
from testbed.agents import MODEL_KEY, ModelEndpoint
from tests.chart.conftest import API_URL, HOME, NS, Release, grant, phase_of, ui_origin, wait_for
from tests.support.browser import UI_WAIT_MS, PageLog, chromium, wait_for_text
from tests.support.dev import ksquad

MODEL = "api-model"
ANSWER = "Answered through the cluster."
KEY_ID = "encryption-key-id"


def squad(release: Release, model: ModelEndpoint) -> None:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "api-key",
                "namespace": NS,
                "labels": {"ksquad.io/credential": "true"},
                "annotations": {"ksquad.io/allowed-hosts": urlsplit(model.url).hostname or ""},
            },
            "stringData": {"apiKey": MODEL_KEY},
        },
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "ModelEndpoint",
            "metadata": {"name": "api-endpoint", "namespace": NS},
            "spec": {"url": model.url, "model": MODEL, "credentialSecretRef": {"name": "api-key"}},
        },
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Agent",
            "metadata": {"name": "api-agent", "namespace": NS},
            "spec": {"modelEndpointRef": "api-endpoint", "systemPrompt": "You answer through the cluster."},
        },
    ]
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


async def answered_run(release: Release, model: ModelEndpoint) -> str:
    """A Run that Succeeded with ANSWER: the watch test's, or (run without it) one made now."""
    for name in ("watched", "answered"):
        found = release.cluster.kubectl("get", "run", name, "-n", NS, "-o", "json", check=False)
        if found.returncode == 0 and json.loads(found.stdout).get("status", {}).get("phase") == "Succeeded":
            return name
    model.script(MODEL, {"text": ANSWER})
    squad(release, model)
    start_run(release, "answered", "Answer through the cluster.")
    done = (await phase_of(release, "answered", {"Succeeded", "Failed"}, timeout=180))["status"]
    assert done["phase"] == "Succeeded", done
    return "answered"


def start_run(release: Release, name: str, task: str, **spec: Any) -> None:
    run = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"agents": ["api-agent"], "inputs": {"task": task}, **spec},
    }
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump(run))


def account(release: Release, name: str, can_get_runs: bool) -> tuple[str, Path]:
    """A ServiceAccount of the Run namespace standing for a user: its token, and a kubeconfig with it."""
    release.kubectl("-n", NS, "create", "serviceaccount", name)
    if can_get_runs:
        grant(release, name, f"{name}-runs", "get,list", "runs.ksquad.io")
        grant(release, name, f"{name}-cm", "get", "configmaps")
    token = release.kubectl("-n", NS, "create", "token", name, "--duration=1h").stdout.strip()
    return token, release.cluster.token_kubeconfig(f"api-{name}", token, NS)


def api_pod(release: Release) -> str:
    pods = release.get("pods", "-n", HOME, "-l", "app.kubernetes.io/component=api")["items"]
    ready = [
        p["metadata"]["name"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
    ]
    return ready[0] if ready else ""


async def test_the_api_refuses_callers_without_credentials_and_those_rbac_refuses(release: Release) -> None:
    await wait_for("ksquad-api to answer on its node port", lambda: api_pod(release), timeout=120)
    stranger, _ = account(release, "stranger", can_get_runs=False)
    async with httpx.AsyncClient(base_url=API_URL, timeout=30) as http:
        decode = await http.post("/codec/decode", json={"payloads": []})
        assert decode.status_code == 401, decode.text
        assert "codec token" in decode.json()["error"]
        assert (await http.get(f"/runs/{NS}/anything/events")).status_code == 401
        forged = await http.get(
            f"/runs/{NS}/anything/events", headers={"Authorization": "Bearer not-a-token"}
        )
        assert forged.status_code == 401, "a token the API server does not accept"
        refused = await http.get(
            f"/runs/{NS}/anything/events", headers={"Authorization": f"Bearer {stranger}"}
        )
        assert refused.status_code == 403, refused.text
        assert (
            f"system:serviceaccount:{NS}:stranger may not get runs.ksquad.io anything"
            in refused.json()["error"]
        )
        artifact = await http.get(
            f"/runs/{NS}/anything/artifacts/answer", headers={"Authorization": f"Bearer {stranger}"}
        )
        assert artifact.status_code == 403, "nor its artifacts"
        no_decoder = await http.post(
            "/codec/decode", json={"payloads": []}, headers={"Authorization": f"Bearer {stranger}"}
        )
        assert no_decoder.status_code == 403, "a cluster user who may not get runs/codec"


async def test_ksquad_runs_watch_streams_a_run_through_the_api_across_its_restart(
    release: Release, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script(MODEL, {"delay": 25, "text": ANSWER})
    squad(release, model)
    _, reader = account(release, "reader", can_get_runs=True)
    start_run(release, "watched", "Answer through the cluster.")
    await phase_of(release, "watched", {"Running"}, timeout=120)
    watch = await asyncio.create_subprocess_exec(
        str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "ksquad"),
        "runs",
        "watch",
        f"{NS}/watched",
        "--kubeconfig",
        str(reader),
        "--api",  # the test bed serves it over plain HTTP, which the ConfigMap's URL may not be (tests/cli)
        API_URL,
        "-o",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert watch.stdout is not None
    seen: list[dict[str, Any]] = []
    while not any(e["kind"] == "phase" and e["data"]["phase"] == "Running" for e in seen):
        seen.append(json.loads(await asyncio.wait_for(watch.stdout.readline(), 60)))
    old = api_pod(release)
    release.kubectl("-n", HOME, "delete", "pod", old, "--wait=false")
    new = await wait_for("a new ksquad-api pod", lambda: (p := api_pod(release)) != old and p, timeout=120)
    out, err = await asyncio.wait_for(watch.communicate(), 180)
    assert watch.returncode == 0, err.decode()
    seen += [json.loads(line) for line in out.decode().splitlines() if line.strip()]

    run = release.run("watched")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    logged = await release.store.events(run["metadata"]["uid"])
    assert [e["seq"] for e in seen] == [e.seq for e in logged], (
        "every event once, in order, across the restart"
    )
    assert {e["kind"] for e in seen} > {"phase"}, "the agent's progress, not only phases"
    assert seen[-1]["data"]["phase"] == "Succeeded"
    assert new != old

    # The artifact's content, through the API, for the same user.
    got = await ksquad(
        tmp_path,
        "runs",
        "artifacts",
        f"{NS}/watched",
        "answer",
        "--kubeconfig",
        str(reader),
        "--api",
        API_URL,
    )
    assert got.code == 0, got.err
    assert got.out == ANSWER


@asynccontextmanager
async def temporal_ui(release: Release, dev_server: DevServer) -> AsyncIterator[tuple[Page, PageLog, str]]:
    """Debian's Chromium with the Temporal UI set to decode through ksquad-api's codec endpoint (not signed in
    yet: `sign_in`), what went wrong for its page, and the UI's origin."""
    ui = ui_origin(dev_server)
    settings = {
        "endpoint": json.dumps(f"{API_URL}/codec"),
        "overrideRemoteCodecConfiguration": "true",
        "includeCredentials": "true",
        "passAccessToken": "false",
    }
    script = "".join(f"localStorage.setItem({k!r}, {v!r});" for k, v in settings.items())
    async with chromium() as browser:
        context = await browser.new_context()
        await context.add_init_script(f"if (location.origin === {ui!r}) {{ {script} }}")
        page = await context.new_page()
        yield page, PageLog(page), ui


async def sign_in(page: Page, release: Release) -> None:
    """Sign the browser in to the codec endpoint with the shared token: the cookie goes with the UI's requests."""
    await page.goto(f"{API_URL}/codec/login")
    await page.fill("input[name=token]", release.codec_token)
    await page.click("button")


async def workflow_page(release: Release, ui: str, workflow_id: str) -> str:
    (workflow,) = [w async for w in release.temporal.list_workflows(f"WorkflowId = '{workflow_id}'")]
    return f"{ui}/namespaces/default/workflows/{quote(workflow_id, safe='')}/{workflow.run_id}/history"


async def current_details(page: Page) -> str:
    """The text the workflow page's Current Details show: the UI renders the (decoded) markdown in a frame of
    its own (/render?content=...)."""
    for _ in range(300):
        for frame in page.frames:
            if "/render?content=" in frame.url and "Paused" in frame.url:
                text = (await frame.inner_text("body")).strip()
                if text:
                    return text
        await asyncio.sleep(0.1)
    raise AssertionError(f"no Current Details rendered: {[f.url[:120] for f in page.frames]}")


async def test_the_temporal_ui_shows_decoded_payloads_through_the_api_codec(
    release: Release, model: ModelEndpoint, dev_server: DevServer, tmp_path: Path
) -> None:
    answered = await answered_run(release, model)
    async with temporal_ui(release, dev_server) as (page, log, ui):
        page_url = await workflow_page(release, ui, f"{NS}/{answered}")
        # Not signed in: the codec refuses, the UI says so and shows no plaintext.
        await page.goto(page_url)
        await page.wait_for_selector('[data-testid="data-encoder-status-error"]', timeout=UI_WAIT_MS)
        assert ANSWER not in await page.content()
        await sign_in(page, release)
        await page.goto(page_url)
        for text in ("Answer through the cluster.", ANSWER, "sandbox for attempt 1"):
            await wait_for_text(page, log, text)
        await page.screenshot(path=str(tmp_path / "temporal-ui-decoded.png"), full_page=True)


async def decode_through_api(release: Release, payloads: list[Any]) -> tuple[int, list[Any]]:
    body = json_format.MessageToJson(Payloads(payloads=payloads))
    async with httpx.AsyncClient(base_url=API_URL, timeout=30) as http:
        response = await http.post(
            "/codec/decode",
            content=body,
            headers={"Authorization": f"Bearer {release.codec_token}", "Content-Type": "application/json"},
        )
    if response.status_code != 200:
        return response.status_code, []
    return 200, list(json_format.Parse(response.text, Payloads()).payloads)


async def history_payloads(release: Release, workflow_id: str) -> list[Any]:
    """Every payload of the workflow's history (the raw client: no codec), found by walking the events."""
    found: list[Any] = []

    def walk(message: Message) -> None:
        if message.DESCRIPTOR.full_name == "temporal.api.common.v1.Payload":
            found.append(message)
            return
        for field, value in message.ListFields():
            if field.message_type is None:
                continue
            if field.message_type.GetOptions().map_entry:
                items = list(value.values())
            elif isinstance(value, Message):
                items = [value]
            else:
                items = list(value)  # a repeated field
            for item in items:
                if isinstance(item, Message):
                    walk(item)

    history = await release.temporal.get_workflow_handle(workflow_id).fetch_history()
    for event in history.events:
        walk(event)
    return found


async def test_a_codec_key_rotated_while_a_run_is_paused_leaves_every_history_readable(
    release: Release, model: ModelEndpoint, dev_server: DevServer, tmp_path: Path
) -> None:
    answered = await answered_run(release, model)  # its history is wholly under the key about to be rotated
    model.script(MODEL, {"error": 429, "retry_after": "90"}, {"text": "after the rotation"})
    squad(release, model)
    start_run(release, "rotated", "Survive a key rotation.")
    paused = (await phase_of(release, "rotated", {"Paused"}, timeout=120))["status"]
    assert paused["pauseReason"] == "RateLimited"
    # As an operator finds it in the Temporal UI: the workflow's page says it is paused and why (its current
    # details), and its timer's summary (decoded through the codec) says when it resumes.
    async with temporal_ui(release, dev_server) as (page, log, ui):
        await sign_in(page, release)
        await page.goto(await workflow_page(release, ui, f"{NS}/rotated"))
        await wait_for_text(page, log, "/rate limited: resume at/")
        await page.get_by_text("User Metadata").click()
        await wait_for_text(page, log, "Current Details")
        shown = await current_details(page)
        await page.screenshot(path=str(tmp_path / "temporal-ui-paused.png"), full_page=True)
        assert shown == f"Paused: {paused['message']}", shown

    # docs/operating.md's rotation: add the key to the Secret, then make it the active one.
    new_key = base64.b64encode(secrets.token_bytes(32)).decode()
    release.kubectl(
        "-n",
        HOME,
        "patch",
        "secret",
        "ksquad-codec",
        "--type=merge",
        "-p",
        json.dumps({"stringData": {"k2": new_key}}),
    )
    rotation = ["--set", "codec.keySecret.key=k2"]
    await release.upgrade(rotation)
    assert release.run("rotated")["status"]["phase"] == "Paused", "rolled while the run waited"

    done = (await phase_of(release, "rotated", {"Succeeded", "Failed"}, timeout=240))["status"]
    assert (done["phase"], done["message"]) == ("Succeeded", "after the rotation"), done

    payloads = await history_payloads(release, f"{NS}/rotated")
    key_ids = {p.metadata[KEY_ID].decode() for p in payloads if KEY_ID in p.metadata}
    assert len(key_ids) == 2, f"written under the old key, then the new one: {key_ids}"
    code, decoded = await decode_through_api(release, payloads)
    assert code == 200 and len(decoded) == len(payloads)
    assert not [p for p in decoded if p.metadata.get("encoding") == b"binary/encrypted"]
    # A history of before the rotation, wholly under the old key, still decodes.
    old = await history_payloads(release, f"{NS}/{answered}")
    code, decoded = await decode_through_api(release, old)
    assert code == 200 and b"Answer through the cluster." in b"".join(p.data for p in decoded)


def scrape(release: Release, component: str) -> str:
    """The /metrics of every pod of a component, concatenated (each pod's health port, on its own address)."""
    texts = []
    for pod in release.get("pods", "-n", HOME, "-l", f"app.kubernetes.io/component={component}")["items"]:
        if pod["metadata"].get("deletionTimestamp") or not pod["status"].get("podIP"):
            continue
        (container,) = pod["spec"]["containers"]
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == "health")
        texts.append(httpx.get(f"http://{pod['status']['podIP']}:{port}/metrics", timeout=10).text)
    return "\n".join(texts)


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples `name{...}` whose labels include `labels` (over every pod scraped)."""
    found = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        present = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(present.get(k) == v for k, v in labels.items()):
            found += float(line.rsplit(" ", 1)[1])
    return found


async def test_metrics_of_the_worker_bridges_and_api_count_what_happened(
    release: Release, model: ModelEndpoint
) -> None:
    model.script(MODEL, {"text": "counted"})
    model.script("api-broken", {"error": 500})
    squad(release, model)
    release.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "Agent",
                "metadata": {"name": "api-broken-agent", "namespace": NS},
                "spec": {"modelEndpointRef": "api-endpoint", "model": "api-broken"},
            }
        ),
    )
    before = {c: await asyncio.to_thread(scrape, release, c) for c in ("worker", "bridge", "api")}
    for name in ("counted-1", "counted-2"):
        start_run(release, name, f"Count {name}.")
    start_run(
        release, "counted-failure", "Fail once.", agents=["api-broken-agent"], retryPolicy={"maxRetries": 0}
    )
    for name in ("counted-1", "counted-2", "counted-failure"):
        await phase_of(release, name, {"Succeeded", "Failed"}, timeout=180)
    # A user reads one run's events through the API, and a stranger is refused.
    reader, _ = account(release, "metrics-reader", can_get_runs=True)
    stranger, _ = account(release, "metrics-stranger", can_get_runs=False)
    async with httpx.AsyncClient(base_url=API_URL, timeout=30) as http:
        for token, code in ((reader, 200), (stranger, 403)):
            got = await http.get(f"/runs/{NS}/counted-1/events", headers={"Authorization": f"Bearer {token}"})
            assert got.status_code == code, got.text
    await asyncio.sleep(1)  # the last status writes
    after = {c: await asyncio.to_thread(scrape, release, c) for c in ("worker", "bridge", "api")}

    def delta(component: str, name: str, **labels: str) -> float:
        return total(after[component], name, **labels) - total(before[component], name, **labels)

    assert delta("worker", "ksquad_runs_finished_total", phase="Succeeded") == 2
    assert delta("worker", "ksquad_runs_finished_total", phase="Failed") == 1
    assert delta("worker", "ksquad_run_phase_seconds_count", phase="Running") == 3, "each left Running once"
    assert delta("worker", "ksquad_sandbox_acquire_seconds_count", kind="cold") == 3, "one Job per attempt"
    assert delta("worker", "ksquad_agent_call_seconds_count", outcome="completed") == 2
    assert delta("worker", "ksquad_agent_call_seconds_count") == 3
    assert delta("worker", "ksquad_claim_seconds_count") == 0, "these runs name no work item"
    assert total(after["worker"], "temporal_workflow_completed_total") > 0, "the SDK's figures too"
    assert delta("bridge", "ksquad_apply_to_status_seconds_count") == 3, "each new Run's first status, once"
    assert delta("bridge", "ksquad_status_mirror_lag_seconds_count") >= 3, "statuses written (coalesced)"
    assert delta("bridge", "ksquad_runs", phase="Succeeded") == 2, "the leader's view of Runs by phase"
    assert delta("api", "ksquad_api_requests_total", route="events", code="200") == 1
    assert delta("api", "ksquad_api_requests_total", route="events", code="403") == 1
    assert total(after["api"], "ksquad_api_event_streams") == 0, "the finished run's stream ended"

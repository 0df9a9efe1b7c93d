"""`ksquad dev`'s API as an attacker meets it: a web page of another origin (in Debian's Chromium, headless)
cannot cancel, pause or create runs; a caller without the token, with the wrong Content-Type, an unknown signal,
a huge or broken body or another Host name is refused with the status that says why; the developer's model key
goes to no model but the local one, and no local agent holds it unless it uses the local model."""

import asyncio
import hashlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from temporalio.client import Client

from agent.scripted_model import ScriptedModel, build_app
from testbed.asgi import serving
from tests.support.browser import PageLog, chromium, wait_for_text
from tests.support.dev import DevProcess

CANARY = "sk-canary-5d1e0c6b"
MARKER = "DECODE-MARKER-3b9e"  # an answer the UI shows near the top of a run's result, once decoded
FAILURE_MARKER = "FAILURE-MARKER-7c41"  # in a model's error text: in a failure's message, never in clear
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=15000",
]
AGENT = {
    "apiVersion": "ksquad.io/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "sec-agent"},
    "spec": {"modelEndpointRef": "local", "systemPrompt": "You help."},
}


def run_doc(name: str, model: str = "slow", agent: str = "sec-agent") -> dict[str, Any]:
    return {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name},
        "spec": {"agents": [agent], "model": model, "inputs": {"task": f"task of {name}"}},
    }


def fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]  # how the scripted model records a bearer


@pytest.fixture(scope="module")
async def local_model() -> AsyncIterator[tuple[str, ScriptedModel]]:
    """The model the developer configured (OPENAI_BASE_URL), answering slowly so runs stay Running."""
    state = ScriptedModel()
    state.load(
        {
            "slow": [{"delay": 600, "text": "never"}],
            "quick": [{"text": "ok"}],
            "marked": [{"text": MARKER}],
            # failures whose text carries a marker: the provider's error, a rate limit's
            "fails-marked": [{"error": 500, "message": f"{FAILURE_MARKER} provider broke"}],
            "limited-marked": [
                {"error": 429, "retry_after": "1", "message": f"{FAILURE_MARKER} slow down"},
                {"text": "ok after the limit"},
            ],
        }
    )
    async with serving(build_app(state)) as url:
        yield f"{url}/v1", state


@pytest.fixture(scope="module")
async def dev(
    tmp_path_factory: pytest.TempPathFactory, local_model: tuple[str, ScriptedModel]
) -> AsyncIterator[DevProcess]:
    url, _ = local_model
    stack = DevProcess(
        tmp_path_factory.mktemp("dev-sec"), env={"OPENAI_BASE_URL": url, "OPENAI_API_KEY": CANARY}
    )
    await stack.start()
    try:
        yield stack
    finally:
        await stack.stop()
        stack.kill_leftover_agents()


def write_docs(path: Path, *docs: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def curl(*args: str) -> tuple[int, str]:
    done = subprocess.run(
        ["curl", "-s", "-o", "-", "-w", "\\n%{http_code}", *args], capture_output=True, text=True, timeout=60
    )
    body, _, code = done.stdout.rpartition("\n")
    return int(code), body


async def test_a_page_of_another_origin_changes_nothing(dev: DevProcess, tmp_path: Path) -> None:
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is missing: `make test` installs it (apt-get install chromium)"
    path = tmp_path / "victim.yaml"
    path.write_text(yaml.safe_dump_all([AGENT, run_doc("victim")]))
    assert (await dev.cli("run", "-f", str(path))).code == 0
    await dev.wait_phase("victim", {"Running"})
    api = dev.info["api"]
    intruder = json.dumps({"documents": [run_doc("intruder", "quick")]})
    script = f"""
    const api = {json.dumps(api)}, tried = [];
    async function attempt(name, call) {{
      try {{ await call(); tried.push(name + ":sent"); }} catch (e) {{ tried.push(name + ":" + e.name); }}
    }}
    (async () => {{
      await attempt("cancel-text", () => fetch(api + "/runs/default/victim/cancel",
        {{method: "POST", mode: "no-cors", body: JSON.stringify({{reason: "x"}})}}));
      await attempt("pause-text", () => fetch(api + "/runs/default/victim/pause",
        {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body: "{{}}"}}));
      await attempt("apply-text", () => fetch(api + "/apply", {{method: "POST", mode: "no-cors", body: {json.dumps(intruder)}}}));
      await attempt("apply-json", () => fetch(api + "/apply",
        {{method: "POST", headers: {{"Content-Type": "application/json"}}, body: {json.dumps(intruder)}}}));
      await attempt("delete", () => fetch(api + "/runs/default/victim", {{method: "DELETE", mode: "no-cors"}}));
      await attempt("list", async () => {{ const r = await fetch(api + "/runs"); document.body.dataset.leak = await r.text(); }});
      const form = document.createElement("form");
      form.method = "POST"; form.action = api + "/runs/default/victim/cancel"; form.enctype = "text/plain";
      form.target = "sink"; form.innerHTML = '<input name="{{&quot;reason&quot;:&quot;x&quot;,&quot;a&quot;:&quot;" value="&quot;}}">';
      document.body.appendChild(form); form.submit();
      await new Promise(r => setTimeout(r, 1500));
      await fetch("/done?tried=" + encodeURIComponent(tried.join(",")));
      document.body.append("done " + tried.join(","));
    }})();
    """
    reports: list[str] = []

    async def page(_: Request) -> Response:
        return HTMLResponse(f"<html><body><iframe name=sink></iframe><script>{script}</script></body></html>")

    async def done(request: Request) -> Response:
        reports.append(request.query_params["tried"])
        return Response("ok")

    async with serving(
        Starlette(routes=[Route("/", page), Route("/done", done)]), host="127.0.0.1"
    ) as attacker:
        assert attacker.split(":")[-1] != api.split(":")[-1], "another origin"
        browser = await asyncio.create_subprocess_exec(
            executable,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--dump-dom",
            attacker + "/",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        dom, _ = await asyncio.wait_for(browser.communicate(), 120)
    assert reports, f"the page ran its attack: {dom.decode()[-2000:]}"
    assert "data-leak" not in dom.decode(), "nothing listed leaked to the page"

    run = await dev.run_json("victim")
    assert run["status"]["phase"] == "Running", "not cancelled, not paused"
    listed = await dev.cli("runs", "list", "-o", "json")
    assert "intruder" not in [r["metadata"]["name"] for r in listed.json()["items"]], "nothing created"
    refused = [line for line in dev.log.read_text().splitlines() if "refused" in line and attacker in line]
    assert len(refused) >= 5, "each attempt reached the API and was refused:\n" + "\n".join(refused)


async def test_callers_without_the_token_or_with_a_bad_request_are_refused_with_the_reason(
    dev: DevProcess,
) -> None:
    api, token = dev.info["api"], dev.api_headers["Authorization"]
    auth, json_type = ["-H", f"Authorization: {token}"], ["-H", "Content-Type: application/json"]
    assert curl(f"{api}/runs")[0] == 401
    assert curl(f"{api}/runs", *auth)[0] == 200
    code, body = curl("-X", "POST", f"{api}/apply", *auth, "-H", "Content-Type: text/plain", "-d", "{}")
    assert code == 415 and "application/json" in body
    code, body = curl(
        "-X", "POST", f"{api}/runs/default/victim/references_updated", *auth, *json_type, "-d", "{}"
    )
    assert code == 400 and "one of cancel, pause, resume" in body
    code, body = curl("-X", "POST", f"{api}/apply", *auth, *json_type, "-d", "{not json")
    assert code == 400 and "the body is not JSON" in body
    big = dev.root / "big.json"
    big.write_text(json.dumps({"documents": [], "pad": "x" * (10 << 20)}))
    code, body = curl("-X", "POST", f"{api}/apply", *auth, *json_type, "--data-binary", f"@{big}")
    assert code == 413 and "larger than" in body
    code, body = curl(f"{api}/runs", *auth, "-H", "Host: attacker.example:80")
    assert code == 421, "a name that resolves to loopback (DNS rebinding) is not this API"
    assert curl(f"{api}/codec/decode", "-X", "POST", *json_type, "-d", "{}")[0] == 401, "the codec too"
    await dev.cli("run", "-f", str(write_docs(dev.root / "cursor.yaml", AGENT, run_doc("cursor", "quick"))))
    for cursor in (
        str(2**63),
        str(2**64),
        "-1",
    ):  # past the store's 64-bit event numbers: refused before streaming
        code, body = curl(f"{api}/runs/default/cursor/events", *auth, "-H", f"Last-Event-ID: {cursor}")
        assert code == 422 and "Last-Event-ID must be an event number from 0 to" in body, (cursor, code, body)
    for name in ("api.token", "ksquad.db", "codec.key", "seal.key", "dev.json"):
        assert (dev.state / name).stat().st_mode & 0o077 == 0, f"{name} is the user's only"


async def test_a_signal_the_run_cannot_take_or_a_body_of_the_wrong_shape_is_refused_and_changes_nothing(
    dev: DevProcess,
) -> None:
    api, token = dev.info["api"], dev.api_headers["Authorization"]
    post = ["-X", "POST", "-H", f"Authorization: {token}", "-H", "Content-Type: application/json"]
    docs = write_docs(dev.root / "shapes.yaml", AGENT, run_doc("shapes"), run_doc("ended", "quick"))
    assert (await dev.cli("run", "-f", str(docs))).code == 0
    await dev.wait_phase("shapes", {"Running"})
    for action, body in (("pause", '["x"]'), ("cancel", '"x"'), ("cancel", '{"reason": 7}')):
        code, answer = curl(*post, f"{api}/runs/default/shapes/{action}", "-d", body)
        refusal = json.loads(answer)["error"]
        assert code == 400 and refusal.startswith(f'{action} takes {{"reason": "..."}} or no body'), answer
    code, answer = curl(*post, f"{api}/runs/default/shapes/input", "-d", '{"text": "nobody asked"}')
    assert (code, json.loads(answer)["error"]) == (
        409,
        "run default/shapes is not waiting for input: it is Running",
    )
    given = await dev.cli("runs", "input", "default/shapes", "nobody asked")
    assert given.code != 0 and "not waiting for input: it is Running" in given.err, given
    await asyncio.sleep(1)  # a signal that got through would show by now
    assert (await dev.run_json("shapes"))["status"]["phase"] == "Running", "none of them reached the run"

    await dev.wait_phase("ended", {"Succeeded"})
    for action in ("cancel", "pause", "input"):
        code, answer = curl(*post, f"{api}/runs/default/ended/{action}", "-d", '{"text": "late"}')
        assert (code, json.loads(answer)["error"]) == (
            409,
            f"run default/ended has ended (Succeeded): it takes no {action}",
        ), answer
    # What the router answers is in the API's shape too.
    code, answer = curl("-H", f"Authorization: {token}", f"{api}/no/such/route")
    assert (code, json.loads(answer)) == (404, {"error": "no such route: GET /no/such/route", "problems": []})
    code, answer = curl("-X", "DELETE", "-H", f"Authorization: {token}", f"{api}/apply")
    assert code == 405 and json.loads(answer)["error"] == "/apply does not take DELETE (it takes POST)", (
        answer
    )
    await dev.cli("runs", "cancel", "default/shapes")


async def test_the_developers_key_goes_to_the_local_model_only(
    dev: DevProcess, local_model: tuple[str, ScriptedModel], tmp_path: Path
) -> None:
    _, local = local_model
    elsewhere = ScriptedModel()
    elsewhere.load({"slow": [{"delay": 600, "text": "never"}]})
    async with serving(build_app(elsewhere)) as listener:
        docs = [
            AGENT,
            {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "ModelEndpoint",
                "metadata": {"name": "borrowed"},
                "spec": {
                    "url": f"{listener}/v1",
                    "credentialSecretRef": {"name": "local-model", "key": "apiKey"},
                },
            },
            {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "ModelEndpoint",
                "metadata": {"name": "keyless"},
                "spec": {"url": f"{listener}/v1"},
            },
            *(
                {
                    "apiVersion": "ksquad.io/v1alpha1",
                    "kind": "Agent",
                    "metadata": {"name": f"{e}-agent"},
                    "spec": {"modelEndpointRef": e, "systemPrompt": "You help."},
                }
                for e in ("borrowed", "keyless")
            ),
            run_doc("uses-local"),
            run_doc("uses-borrowed", agent="borrowed-agent"),
            run_doc("uses-keyless", agent="keyless-agent"),
        ]
        path = tmp_path / "key.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        assert (await dev.cli("run", "-f", str(path))).code == 0
        await dev.wait_phase("uses-local", {"Running"})
        await dev.wait_phase("uses-keyless", {"Running"})
        # Naming the local key for another server is refused before any sandbox: it may go to the local model only.
        borrowed = (await dev.wait_phase("uses-borrowed", {"Failed"}))["status"]
        assert borrowed["reason"] == "InvalidReferences", borrowed
        assert "Secret default/local-model may be sent only to " in borrowed["message"], borrowed
        assert f"not to {listener.split('://')[1]} (ModelEndpoint default/borrowed)" in borrowed["message"]
        for _ in range(100):
            if any(c.model == "slow" for c in elsewhere.calls) and any(
                c.model == "slow" for c in local.calls
            ):
                break
            await asyncio.sleep(0.1)
        assert elsewhere.calls, "the keyless run called the listener"
        assert fingerprint(CANARY) not in {c.credential for c in elsewhere.calls}, "the canary never left"
        assert fingerprint(CANARY) in {c.credential for c in local.calls}, "the local model got it"
        environments = {name: agent_environment(dev, name) for name in ("uses-local", "uses-keyless")}
    assert CANARY in environments["uses-local"]
    assert CANARY not in environments["uses-keyless"]
    assert "OPENAI_BASE_URL" not in environments["uses-keyless"], (
        "an agent inherits nothing of the developer's"
    )
    for name in ("uses-local", "uses-keyless"):
        await dev.cli("runs", "cancel", name)


def agent_environment(dev: DevProcess, run: str) -> str:
    """The environment of the local agent of `run`'s first attempt, as /proc shows it."""
    pid = int((dev.state / "sandboxes" / f"{run}-exec-1.pid").read_text())
    return (Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n")).decode()


def failures_in(history: Any) -> list[Any]:
    """Every failure the history records (an activity's, a workflow task's, the workflow's), causes too."""
    found = []
    for event in history.events:
        for field in (
            "activity_task_failed_event_attributes",
            "workflow_task_failed_event_attributes",
            "workflow_execution_failed_event_attributes",
        ):
            if event.HasField(field):
                failure = getattr(event, field).failure
                while failure.message or failure.encoded_attributes.data:
                    found.append(failure)
                    if not failure.HasField("cause"):
                        break
                    failure = failure.cause
    return found


async def test_failure_messages_are_ciphertext_in_the_raw_history_for_each_kind_of_failure(
    dev: DevProcess, tmp_path: Path
) -> None:
    """A model's error text reaches the history in failures (the agent call's, the attempt's, a rate limit's), in
    the Run's final status and in a cancel's reason: read by a client without the codec, every failure's message is
    "Encoded failure" with its text in encoded attributes, and the text is nowhere in the raw history."""
    failing = {
        **run_doc("fails-marked", "fails-marked"),
        "spec": {
            **run_doc("x", "fails-marked")["spec"],
            "retryPolicy": {"maxRetries": 1, "backoffSeconds": 1},
        },
    }
    path = tmp_path / "failing.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [AGENT, failing, run_doc("limited-marked", "limited-marked"), run_doc("cancelled-marked", "slow")]
        )
    )
    assert (await dev.cli("run", "-f", str(path))).code == 0
    await dev.wait_phase("cancelled-marked", {"Running"})
    reason = f"{FAILURE_MARKER} no longer needed"
    cancelled = await dev.cli("runs", "cancel", "cancelled-marked", "--reason", reason)
    assert cancelled.code == 0, cancelled.err
    ended = {
        name: (await dev.wait_phase(name, phases, within=120))["status"]
        for name, phases in (
            ("fails-marked", {"Failed"}),
            ("limited-marked", {"Succeeded"}),
            ("cancelled-marked", {"Cancelled"}),
        )
    }
    assert FAILURE_MARKER in ended["fails-marked"]["message"], (
        "the status, decoded, keeps the provider's text"
    )
    plain = await Client.connect(dev.info["temporal"])  # no codec
    kinds: set[str] = set()
    for name, status in ended.items():
        workflow = status["workflow"]
        history = await plain.get_workflow_handle(workflow["id"], run_id=workflow["runId"]).fetch_history()
        raw = b"".join(event.SerializeToString() for event in history.events)
        assert FAILURE_MARKER.encode() not in raw, f"{name}: the text is in clear in the history"
        for failure in failures_in(history):
            assert failure.message == "Encoded failure", f"{name}: {failure.message}"
            assert failure.encoded_attributes.data and not failure.stack_trace, name
            kinds.add(failure.application_failure_info.type or "cause")
    assert {"AgentFailed", "RateLimited"} <= kinds, f"the failures looked at: {kinds}"


async def test_another_local_process_cannot_decode_the_history_the_signed_in_browser_can(
    dev: DevProcess, tmp_path: Path
) -> None:
    """Any local process can send an `Origin` header and read the UI's settings, so neither opens the codec: its
    token or the session cookie that signing in (with the link `ksquad dev` printed) gives the browser does."""
    marker = MARKER
    path = tmp_path / "decoded.yaml"
    path.write_text(yaml.safe_dump_all([AGENT, run_doc("decoded", "marked")]))
    assert (await dev.cli("run", "-f", str(path))).code == 0
    run = (await dev.wait_phase("decoded", {"Succeeded"}))["status"]["workflow"]

    plain = await Client.connect(dev.info["temporal"])
    history = await plain.get_workflow_handle(run["id"], run_id=run["runId"]).fetch_history()
    raw = b"".join(event.SerializeToString() for event in history.events)
    assert marker.encode() not in raw, "the answer is ciphertext in the history"
    completed = history.events[-1].workflow_execution_completed_event_attributes.result
    body = json_format.MessageToJson(completed)
    api = dev.info["api"]
    for origin in (api, dev.info["temporalUi"]):
        for route in ("decode", "encode"):
            code, answer = curl(
                "-X",
                "POST",
                f"{api}/codec/{route}",
                "-H",
                "Content-Type: application/json",
                "-H",
                f"Origin: {origin}",
                "--data",
                body,
            )
            assert code in (401, 403) and marker not in answer, (origin, route, code, answer)

    page_url = f"/ui/namespaces/default/workflows/{quote(run['id'], safe='')}/{run['runId']}/history"
    async with chromium() as browser:
        page = await (await browser.new_context()).new_page()
        log = PageLog(page)
        await page.goto(api + page_url)  # not signed in: the API says how to
        assert "sign in first" in await page.content()
        await page.goto(f"{dev.info['uiSignIn']}&next={quote(page_url)}")
        await wait_for_text(page, log, marker, tmp_path / "embedded-ui-decoded.png")

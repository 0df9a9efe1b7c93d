"""The `ksquad` CLI against the embedded stack (`ksquad dev` in its own process): every command, its `-o json`
output, and its errors (an unknown run, an invalid manifest, no stack to talk to)."""

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client

from temporal_client.codec import ENCODING
from tests.support.dev import DevProcess, ksquad

# An answer that would set the terminal's title, clear the screen and hide what follows, were it printed raw.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[8mhidden\x1b[0m\x9bdone"

AGENT = {
    "apiVersion": "ksquad.io/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "cli-agent"},
    "spec": {"modelEndpointRef": "local", "systemPrompt": "You answer tersely."},
}


def run_doc(name: str, model: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name},
        "spec": {"agents": ["cli-agent"], "model": model, "inputs": {"task": f"task of {name}"}, **spec},
    }


@pytest.fixture(scope="module")
async def dev(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevProcess]:
    stack = DevProcess(tmp_path_factory.mktemp("dev-cli"))
    await stack.start()
    model = stack.info["model"].removesuffix("/v1")
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{model}/_script",
            json={
                "models": {
                    "quick": [{"delay": 0.3, "text": "quick answer"}],
                    "hostile": [{"text": HOSTILE}],
                    "slow": [{"delay": 600, "text": "never"}],
                }
            },
        )
        response.raise_for_status()
    try:
        yield stack
    finally:
        assert await stack.stop() == 0, "Ctrl-C stops it cleanly"
        stack.kill_leftover_agents()


def write(path: Path, *docs: object) -> str:
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


async def test_run_then_list_get_and_watch_a_run_to_success(dev: DevProcess, tmp_path: Path) -> None:
    applied = await dev.cli(
        "run", "-f", write(tmp_path / "quick.yaml", AGENT, run_doc("quick-1", "quick")), "-o", "json"
    )
    assert applied.code == 0, applied.err
    assert {(a["kind"], a["name"], a["action"]) for a in applied.json()["applied"]} >= {
        ("Run", "quick-1", "created")
    }

    watched = await dev.cli("runs", "watch", "quick-1", "-o", "json")
    assert watched.code == 0, watched.err
    events = [yaml.safe_load(line) for line in watched.out.splitlines()]
    phases = [e["data"]["phase"] for e in events if e["kind"] == "phase"]
    assert phases == ["Pending", "Claiming", "Running", "Succeeded"], phases
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events), "events arrive in order"
    assert any(e["kind"] != "phase" for e in events), "the agent's progress is in the stream"

    listed = await dev.cli("runs", "list", "-o", "json")
    assert listed.code == 0, listed.err
    [item] = [i for i in listed.json()["items"] if i["metadata"]["name"] == "quick-1"]
    assert item["status"]["phase"] == "Succeeded"
    table = await dev.cli("runs", "list")
    assert table.out.splitlines()[0].split() == [
        "NAMESPACE",
        "NAME",
        "PHASE",
        "REASON",
        "ATTEMPT",
        "AGENT",
        "ITEM",
        "TOKENS",
        "AGE",
    ]
    assert any(line.split()[:3] == ["default", "quick-1", "Succeeded"] for line in table.out.splitlines())

    got = await dev.run_json("quick-1")
    assert got["status"]["outputs"] == {"answer": "quick answer"}
    assert got["status"]["workflow"]["id"] == "default/quick-1"
    assert got["status"]["triggeredBy"], "the local user is recorded"
    as_yaml = await dev.cli("runs", "get", "quick-1", "-o", "yaml")
    assert yaml.safe_load(as_yaml.out)["status"]["phase"] == "Succeeded"
    described = await dev.cli("runs", "describe", "default/quick-1")
    assert "phase:    Succeeded" in described.out and "output answer: quick answer" in described.out

    human = await dev.cli("runs", "watch", "quick-1")  # a finished run: its story, then its summary
    assert "Succeeded" in human.out and "Run default/quick-1" in human.out

    # The agent's artifacts: listed from the status, each one's content from the store (nothing gave it back).
    artifacts = await dev.cli("runs", "artifacts", "quick-1", "-o", "json")
    assert artifacts.code == 0, artifacts.err
    assert [a["name"] for a in artifacts.json()["items"]] == ["answer"]
    content = await dev.cli("runs", "artifacts", "quick-1", "answer")
    assert (content.code, content.out) == (0, "quick answer")
    missing = await dev.cli("runs", "artifacts", "quick-1", "nothing-of-the-kind")
    assert missing.code == 1 and "has no artifact 'nothing-of-the-kind'" in missing.err


async def test_pause_resume_cancel_and_delete_steer_a_running_run(dev: DevProcess, tmp_path: Path) -> None:
    assert (
        await dev.cli("run", "-f", write(tmp_path / "slow.yaml", AGENT, run_doc("slow-1", "slow")))
    ).code == 0
    await dev.wait_phase("slow-1", {"Running"})

    paused = await dev.cli("runs", "pause", "slow-1", "--reason", "a look first", "-o", "json")
    assert paused.code == 0, paused.err
    assert paused.json() == {"run": "default/slow-1", "signal": "pause"}
    run = await dev.wait_phase("slow-1", {"Paused"})
    assert run["status"]["attempt"] == 1
    assert run["status"]["message"] == "a look first", "the reason given is shown"

    assert (await dev.cli("runs", "resume", "slow-1")).code == 0
    run = await dev.wait_phase("slow-1", {"Running"})
    assert run["status"]["attempt"] == 2, "resuming dispatches a new attempt"

    cancelled = await dev.cli("runs", "cancel", "slow-1", "--reason", "not needed", "-o", "json")
    assert cancelled.json() == {"run": "default/slow-1", "signal": "cancel"}
    run = await dev.wait_phase("slow-1", {"Cancelled"})
    assert run["status"]["message"] == "not needed"
    assert not dev.leftover_agents(), "the cancelled run's sandbox is gone"

    deleted = await dev.cli("runs", "delete", "slow-1", "-o", "json")
    assert deleted.json() == {"run": "default/slow-1", "deleted": True}
    listed = await dev.cli("runs", "list", "-o", "json")
    assert "slow-1" not in [i["metadata"]["name"] for i in listed.json()["items"]]


@pytest.mark.parametrize("command", ["get", "describe", "watch", "cancel", "pause", "resume", "delete"])
async def test_an_unknown_run_is_an_error_naming_it(dev: DevProcess, command: str) -> None:
    result = await dev.cli("runs", command, "nope", "-n", "elsewhere", "-o", "json")
    assert result.code == 1
    assert result.err.strip() == 'Error: run "elsewhere/nope" not found'
    assert result.out == ""


async def test_an_invalid_manifest_is_refused_whole_with_each_field_named(
    dev: DevProcess, tmp_path: Path
) -> None:
    bad_run = run_doc("bad-1", "quick", retryPolicy={"maxRetries": 50})
    bad_agent = {**AGENT, "metadata": {"name": "Not_A_Name"}}
    result = await dev.cli("run", "-f", write(tmp_path / "bad.yaml", bad_run, bad_agent, {"kind": "Pod"}))
    assert result.code == 1
    assert (
        "document 1 (Run bad-1): spec.retryPolicy.maxRetries: Input should be less than or equal to 20"
        in result.err
    )
    assert "document 2 (Agent Not_A_Name): metadata.name: String should match pattern" in result.err
    assert "document 3: apiVersion: ksquad.io/v1alpha1 expected" in result.err
    listed = await dev.cli("runs", "list", "-o", "json")
    assert "bad-1" not in [i["metadata"]["name"] for i in listed.json()["items"]], "nothing of it was applied"
    missing = await dev.cli("run", "-f", str(tmp_path / "absent.yaml"))
    assert missing.code == 1 and "cannot read" in missing.err


async def test_server_sent_events_replay_after_the_last_event_id(dev: DevProcess, tmp_path: Path) -> None:
    assert (
        await dev.cli("run", "-f", write(tmp_path / "q.yaml", AGENT, run_doc("quick-2", "quick")))
    ).code == 0
    await dev.wait_phase("quick-2", {"Succeeded"})
    async with httpx.AsyncClient(base_url=dev.info["api"], headers=dev.api_headers) as http:
        whole = (await http.get("/runs/default/quick-2/events")).text
        replayed = (await http.get("/runs/default/quick-2/events", headers={"Last-Event-ID": "2"})).text
    ids = [int(line[4:]) for line in whole.splitlines() if line.startswith("id: ")]
    assert ids == list(range(1, len(ids) + 1)), "every event, numbered from 1"
    assert [int(line[4:]) for line in replayed.splitlines() if line.startswith("id: ")] == ids[2:]
    assert whole.rstrip().endswith('event: end\ndata: {"phase": "Succeeded"}')


async def test_items_are_created_commented_read_and_closed_as_the_developer(dev: DevProcess) -> None:
    created = await dev.cli(
        "items", "create", "PAY-7", "--title", "Flaky retry test", "--body", "It fails one run in ten.",
        "--label", "ci", "-o", "json",
    )  # fmt: skip
    assert created.code == 0, created.err
    developer = created.json()["created_by"]
    assert (await dev.cli("items", "comment", "PAY-7", "Seen on main too.")).out.strip() == (
        "work item default/PAY-7: comment #2 added"
    )
    closed = await dev.cli("items", "close", "PAY-7", "--note", "fixed by freezing time")
    assert closed.out.strip() == "work item default/PAY-7: done"
    listed = await dev.cli("items", "list")
    assert listed.out.splitlines()[0].split() == ["ID", "STATE", "TITLE", "BY", "UPDATED"]
    assert listed.out.splitlines()[1].split()[:2] == ["PAY-7", "done"]
    shown = await dev.cli("items", "get", "PAY-7")
    entries = [re.sub(r"\d+s ago", "_ ago", line.strip()) for line in shown.out.splitlines() if "#" in line]
    assert entries == [
        f"#1 _ ago, {developer}: created: Flaky retry test",
        f"#2 _ ago, {developer}: comment: Seen on main too.",
        f"#3 _ ago, {developer}: -> done: fixed by freezing time",
    ], shown.out
    whole = (await dev.cli("items", "get", "PAY-7", "-o", "json")).json()
    assert [e["kind"] for e in whole["entries"]] == ["created", "comment", "state"]

    unknown = await dev.cli("items", "comment", "PAY-0", "hello", "-n", "elsewhere")
    assert (unknown.code, unknown.err.strip()) == (1, "Error: no work item PAY-0 in namespace elsewhere")
    again = await dev.cli("items", "close", "PAY-7")
    assert again.code == 1 and "PAY-7 is done: it can go to open" in again.err
    taken = await dev.cli("items", "create", "PAY-7", "--title", "again")
    assert taken.code == 1 and "exists in namespace default" in taken.err
    reopened = await dev.cli("items", "reopen", "PAY-7", "-o", "json")
    assert reopened.json()["data"] == {"state": "open"}


async def test_without_a_stack_the_cli_says_how_to_start_one(tmp_path: Path) -> None:
    result = await ksquad(tmp_path, "runs", "list")
    assert result.code == 1
    assert "no embedded stack" in result.err and "ksquad dev" in result.err


def payloads_in(message: Message) -> list[Payload]:
    """Every Payload anywhere in a history event (fields, lists and maps)."""
    found: list[Payload] = []
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE or field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = list(value.values())
        else:
            items = [value] if isinstance(value, Message) else list(value)
        for item in items:
            if isinstance(item, Payload):
                found.append(item)
            elif isinstance(item, Message):
                found += payloads_in(item)
    return found


async def test_history_holds_no_input_or_prompt_in_clear_and_the_codec_endpoint_decodes_it(
    dev: DevProcess, tmp_path: Path
) -> None:
    secret_task, secret_prompt = "TASK-MARKER-7f3a: fix the ledger", "PROMPT-MARKER-91c2: be careful"
    agent = {
        **AGENT,
        "metadata": {"name": "codec-agent"},
        "spec": {"modelEndpointRef": "local", "systemPrompt": secret_prompt},
    }
    run = run_doc("codec-1", "quick", agents=["codec-agent"], inputs={"task": secret_task})
    assert (await dev.cli("run", "-f", write(tmp_path / "codec.yaml", agent, run))).code == 0
    await dev.wait_phase("codec-1", {"Succeeded"})

    plain = await Client.connect(dev.info["temporal"])  # no codec: what the server stores and shows
    history = await plain.get_workflow_handle("default/codec-1").fetch_history()
    raw = b"".join(event.SerializeToString() for event in history.events)
    assert b"TASK-MARKER-7f3a" not in raw and b"PROMPT-MARKER-91c2" not in raw
    assert b"cli-agent" not in raw and b"quick answer" not in raw, "results are encrypted too"
    payloads = [p for e in history.events for p in payloads_in(e) if p.metadata.get("encoding") == ENCODING]
    assert len(payloads) >= 5

    body = json_format.MessageToJson(Payloads(payloads=payloads))
    json_body = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=dev.info["codecEndpoint"]) as http:
        refused = await http.post("/decode", content=body, headers=json_body)
        assert refused.status_code == 401
        decoded = await http.post("/decode", content=body, headers={**json_body, **dev.api_headers})
        assert decoded.status_code == 200
        clear = b"".join(p.data for p in json_format.Parse(decoded.text, Payloads()).payloads)
        assert b"TASK-MARKER-7f3a" in clear and b"PROMPT-MARKER-91c2" in clear
        # An Origin header proves nothing (any local process sends one): the UI decodes through the API's own
        # origin, with the session of the browser that signed in (tests/dev/test_dev_api_security.py).
        ui = await http.post("/decode", content=body, headers={**json_body, "Origin": dev.info["temporalUi"]})
        assert ui.status_code == 403 and "access-control-allow-origin" not in ui.headers
        other = await http.post(
            "/decode", content=body, headers={**json_body, "Origin": "http://evil.example"}
        )
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    key = (dev.state / "codec.key").read_text().strip()
    for log in (dev.log, dev.state / "dev.log"):
        assert key not in log.read_text(), f"the codec key is never logged ({log})"


async def test_an_agents_control_characters_never_reach_the_terminal_raw(
    dev: DevProcess, tmp_path: Path
) -> None:
    applied = await dev.cli(
        "run", "-f", write(tmp_path / "hostile.yaml", AGENT, run_doc("hostile-1", "hostile"))
    )
    assert applied.code == 0, applied.err
    watched = await dev.cli("runs", "watch", "hostile-1")
    assert watched.code == 0, watched.err
    for shown in (
        watched,
        await dev.cli("runs", "describe", "hostile-1"),
        await dev.cli("runs", "list"),
        await dev.cli("runs", "get", "hostile-1", "-o", "yaml"),
    ):
        assert shown.code == 0, shown.err
        raw = [
            c for c in shown.out + shown.err if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0
        ]
        assert raw == [], f"control characters printed raw: {raw!r}"
    described = (await dev.cli("runs", "describe", "hostile-1")).out
    assert "\\x1b]0;owned\\x07" in described, "shown, escaped"
    as_json = await dev.cli("runs", "get", "hostile-1", "-o", "json")
    assert as_json.json()["status"]["outputs"]["answer"] == HOSTILE, "JSON carries the text exactly (escaped)"
    content = await dev.cli("runs", "artifacts", "hostile-1", "answer")  # into a pipe: the bytes as written
    assert content.out == HOSTILE

"""`ksquad dev --demo` (what `make demo` runs): three runs on the embedded stack, each telling part of the story.

1. the seed's Run (`examples/fix-flaky-tests.yaml`, verbatim) with its squad (`examples/local-squad.yaml`):
   Pending -> Claiming -> Running -> Succeeded, with the agent's answer as its output; its work item (made
   first, with a comment of the developer's) read by the agent, commented on, done, its answer listed there;
2. a Run whose model answers 429 with Retry-After: Paused(RateLimited) until then, resumed, Succeeded;
3. a Run whose model takes ten minutes: cancelled while Running, ends Cancelled with its sandbox gone.

Then a summary table, the work item's record and the Temporal UI address (checked to answer). Exit status 0 only when every run
ended as expected.
"""

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from dev.stack import DevStack
from store import Author
from workflows.signals import RunSignal
from workflows.status import Phase

# examples/ of the checkout; an installed wheel carries the same files as dev/examples (pyproject.toml).
EXAMPLES = next(
    path
    for path in (
        Path(__file__).resolve().parent / "examples",
        Path(__file__).resolve().parents[1] / "examples",
    )
    if (path / "fix-flaky-tests.yaml").is_file()
)
DEMO_TIMEOUT_SECONDS = 100.0
ITEM_TITLE = "Stabilize the flaky payment-retry test"
ITEM_COMMENT = "It reads the wall clock: look there first."


def load(*files: Path) -> list[Any]:
    return [doc for f in files for doc in yaml.safe_load_all(f.read_text()) if doc]


class Timeline:
    """Prints each run's phase changes and agent progress as they happen."""

    def __init__(self, dev: DevStack) -> None:
        self.dev = dev
        self.t0 = time.monotonic()
        self.cursors: dict[str, int] = {}

    async def poll(self, runs: dict[str, str]) -> None:  # name -> uid
        for name, uid in runs.items():
            for event in await self.dev.store.events(uid, self.cursors.get(uid, 0)):
                self.cursors[uid] = event.seq
                print(
                    f"  {time.monotonic() - self.t0:5.1f}s  {name:<22} {event.kind:<9} {event.message[:90]}",
                    flush=True,
                )


async def run_demo(dev: DevStack) -> int:
    namespace = "ksquad-system"
    squad = EXAMPLES / "local-squad.yaml"
    seed, limited, cancelled = (
        EXAMPLES / "fix-flaky-tests.yaml",
        EXAMPLES / "demo" / "rate-limited.yaml",
        EXAMPLES / "demo" / "cancelled.yaml",
    )
    names = [doc["metadata"]["name"] for doc in load(seed, limited, cancelled)]
    for name in names:  # a previous demo's runs: start afresh
        if await dev.runs.objects.get("Run", namespace, name) is not None:
            await dev.runs.delete(namespace, name)
    timeline = Timeline(dev)
    uids: dict[str, str] = {}
    item_id = load(seed)[0]["spec"]["workItemRef"]
    developer = Author(dev.runs.user)
    item = await dev.store.find_item(namespace, item_id)
    if item is None:
        await dev.store.create_item(namespace, item_id, title=ITEM_TITLE, created_by=developer.user or "")
    elif item.state == "done":  # a previous demo's: open it again
        await dev.store.set_item_state(namespace, item_id, "open", developer, note="the demo runs again")
    said = await dev.store.comment(namespace, item_id, ITEM_COMMENT, developer)
    print(f"\nwork item {namespace}/{item_id}: {ITEM_TITLE!r}, and your comment {ITEM_COMMENT!r}")

    async def apply(*files: Path) -> None:
        for result in await dev.runs.apply(load(*files)):
            print(
                f"  {time.monotonic() - timeline.t0:5.1f}s  {result['kind']} {result['namespace']}/{result['name']} "
                f"{result['action']}",
                flush=True,
            )
            if result["kind"] == "Run":
                uids[result["name"]] = (await dev.runs.get(namespace, result["name"])).uid

    async def phase(name: str) -> Phase:
        run = await dev.runs.get(namespace, name)
        return Phase((run.status or {}).get("phase", "Pending"))

    async def until(done: Any, what: str) -> None:
        deadline = time.monotonic() + DEMO_TIMEOUT_SECONDS
        while not await done():
            await timeline.poll(uids)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the demo waited {DEMO_TIMEOUT_SECONDS:.0f}s for {what}")
            await asyncio.sleep(0.2)
        await timeline.poll(uids)

    print("\n1. the seed's Run and a long one, applied together; the long one is cancelled once it runs\n")
    await apply(squad, seed, cancelled)
    seed_name, limited_name, cancelled_name = names

    async def cancelled_running() -> bool:
        return await phase(cancelled_name) == Phase.RUNNING

    await until(cancelled_running, f"{cancelled_name} to be Running")
    await dev.runs.signal(namespace, cancelled_name, RunSignal.CANCEL, "cancelled by the demo")

    async def first_two_done() -> bool:
        return (await phase(seed_name)).terminal and (await phase(cancelled_name)).terminal

    await until(first_two_done, f"{seed_name} and {cancelled_name} to finish")
    print("\n2. a Run whose model answers 429 with Retry-After: it pauses, resumes by itself, and succeeds\n")
    await apply(limited)

    async def limited_done() -> bool:
        return (await phase(limited_name)).terminal

    await until(limited_done, f"{limited_name} to finish")

    expected = {seed_name: Phase.SUCCEEDED, limited_name: Phase.SUCCEEDED, cancelled_name: Phase.CANCELLED}
    print(
        f"\n{'RUN':<22} {'PHASE':<10} {'EXPECTED':<10} {'ATTEMPTS':<9} {'PAUSED':<13} {'DURATION':<9} OUTPUT"
    )
    ok = True
    for name in names:
        run = await dev.runs.get(namespace, name)
        status = run.status or {}
        events = await dev.store.events(run.uid)
        phases = [e.data for e in events if e.kind == "phase"]
        paused = next((p["reason"] for p in phases if p["phase"] == Phase.PAUSED), "-")
        times = [datetime.fromisoformat(p["at"]) for p in phases]
        duration = f"{(times[-1] - times[0]).total_seconds():.1f}s" if len(times) > 1 else "-"
        output = next(iter(status.get("outputs", {}).values()), status.get("message") or "")
        ok &= status.get("phase") == expected[name]
        print(
            f"{name:<22} {status.get('phase', '?'):<10} {expected[name]:<10} {status.get('attempt', 0):<9} "
            f"{paused or '-':<13} {duration:<9} {output[:60]}"
        )
    print(f"\nwork item {namespace}/{item_id}, as `ksquad items get -n {namespace} {item_id}` shows it:")
    for entry in await dev.store.item_events(namespace, item_id, after=said.seq - 1):
        who = f"{entry.author.run} attempt {entry.author.attempt}" if entry.author.run else entry.author.user
        if entry.kind == "ended":
            who = "ksquad"
        what = {
            "comment": f"wrote: {entry.body[:70]}",
            "state": f"set it {(entry.data or {}).get('state')}",
            "artifact": f"published {(entry.data or {}).get('name')}",
            "ended": f"recorded: {entry.body[:100]}",
        }.get(entry.kind, entry.kind)
        print(f"  #{entry.seq:<3} {who}  {what}")
    item = await dev.store.item(namespace, item_id)
    ok &= item.state == "done"
    async with httpx.AsyncClient(follow_redirects=True) as http:  # signed in, as the developer's browser is
        ui_status = (await http.get(dev.ui_signin_url or dev.ui_url, timeout=10)).status_code
        console_status = (await http.get(dev.console_signin_url, timeout=10)).status_code
    ok &= ui_status == 200 and console_status == 200
    print(f"\nConsole (HTTP {console_status}): sign in with {dev.console_signin_url}")
    print(
        f"Temporal UI (HTTP {ui_status}): sign in with {dev.ui_signin_url}, then the runs are at "
        f"{dev.ui_url}namespaces/default/workflows?query=KsquadNamespace%3D%22{namespace}%22"
    )
    print(
        f"Inputs and prompts in the history are encrypted; the UI decodes them through {dev.api_url}/codec, "
        "for the browser that signed in."
    )
    print(
        "all three runs ended as expected, and the work item is done"
        if ok
        else "NOT every run ended as expected (or the work item is not done)"
    )
    return 0 if ok else 1


REAL_MODEL_TIMEOUT_SECONDS = 600.0
CARRY_ON = "Carry on with what you have, and answer in a few sentences."


async def run_real_model_demo(dev: DevStack) -> int:
    """`ksquad dev --demo --real-model`: the seed's Run against the model at OPENAI_BASE_URL (`make demo MODEL=local`:
    llama.cpp's server with SmolLM2-135M-Instruct): its phases and the agent's progress as they happen, then its
    answer and the tokens charged to the credential and the person. What the model says is its own; a question it
    asks (the agent may ask the person) is answered once, so the demo ends whatever the model does."""
    namespace = "ksquad-system"
    squad, seed = EXAMPLES / "local-squad.yaml", EXAMPLES / "fix-flaky-tests.yaml"
    name = load(seed)[0]["metadata"]["name"]
    if await dev.runs.objects.get("Run", namespace, name) is not None:
        await dev.runs.delete(namespace, name)
    timeline = Timeline(dev)
    print(f"\nthe seed's Run against the model at {dev.model_url}\n")
    await dev.runs.apply(load(squad, seed))
    run = await dev.runs.get(namespace, name)
    uids = {name: run.uid}
    deadline = time.monotonic() + REAL_MODEL_TIMEOUT_SECONDS
    answered = False
    while True:
        await timeline.poll(uids)
        status = (await dev.runs.get(namespace, name)).status or {}
        phase = Phase(status.get("phase", "Pending"))
        if phase.terminal:
            break
        if phase == Phase.PAUSED and status.get("reason") == "InputRequired" and not answered:
            print(f"  the model asked: {status.get('message', '')[:120]!r}; the demo answers {CARRY_ON!r}")
            await dev.runs.signal(namespace, name, RunSignal.INPUT, CARRY_ON)
            answered = True
        if time.monotonic() > deadline:
            print(f"the Run did not finish in {REAL_MODEL_TIMEOUT_SECONDS:.0f}s (phase {phase})")
            return 1
        await asyncio.sleep(0.5)
    await timeline.poll(uids)
    answer = next(iter(status.get("outputs", {}).values()), status.get("message") or "")
    usage = await dev.store.run_usage(run.uid)
    since = datetime.fromtimestamp(0).astimezone()
    credentials = await dev.store.usage("credential", since, namespace=namespace)
    people = await dev.store.usage("triggered_by", since, namespace=namespace)
    print(f"\n{name}: {status.get('phase')} after {status.get('attempt', 0)} attempt(s)")
    print(f"answer: {answer[:800]}")
    print(f"usage: {usage.calls} model call(s), {usage.input_tokens} tokens in, {usage.output_tokens} out")
    print(
        "charged to credential "
        + ", ".join(f"{u.key} ({u.input_tokens + u.output_tokens})" for u in credentials)
    )
    print("and to person " + ", ".join(f"{u.key} ({u.input_tokens + u.output_tokens})" for u in people))
    ok = status.get("phase") == Phase.SUCCEEDED and usage.calls > 0 and usage.output_tokens > 0
    print("the Run succeeded and its tokens were charged" if ok else "NOT as expected")
    return 0 if ok else 1

"""The console on the embedded default, driven in Debian's Chromium as a person uses it: the real stack underneath
(Temporal's dev server, the worker, SQLite, local sandboxes of the reference agent, the scripted model over
HTTP). Each test signs in with the link `ksquad dev` prints and works through pages only: it follows a run live,
watches a rate-limited run count down and resume, answers an agent's question, cancels a run, comments on a work
item for the next attempt to read, keeps a Team's memory (search, add, edit, delete) for its next Run, starts a
run as the developer. A run and an agent made of markup and script
run nothing in the page. Screenshots of the main pages land in test-output/console/ (pytest's summary names them, for CI to keep)."""

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page

from dev.stack import TOKEN_FILE, DevStack, dev_stack
from store import Author
from testbed.embedded import stack_options, wait_terminal
from tests.support.browser import CONSOLE_SHOTS as SHOTS
from tests.support.browser import PageLog, chromium, wait_for_text
from workflows.signals import RunSignal

NS = "bench"  # wait_terminal's namespace
API = "ksquad.io/v1alpha1"
# Markup and script in everything an agent or a person can write: none of it may run, or fetch anything.
PAYLOAD = "<img src=x onerror=\"fetch('http://attacker.invalid/img')\"><script>window.pwned=1</script>"
SCRIPT: dict[str, list[dict[str, Any]]] = {
    "steady": [{"delay": 4, "text": "the flaky test now freezes its clock"}],
    "limited": [{"error": 429, "retry_after": "12"}, {"text": "answered after the limit"}],
    "asks": [
        {"tool_calls": [{"name": "ksquad_request_input", "arguments": {"question": "Which test is flaky?"}}]},
        {"text": "fixed the test you named"},
    ],
    "slow": [{"delay": 600, "text": "never"}],
    "fails-once": [{"error": 500}, {"text": "read the comment and fixed it"}],
    "quick": [{"text": "done"}],
    "hostile": [{"text": f"answer {PAYLOAD}"}],
}


@pytest.fixture(scope="module")
async def dev(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevStack]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    async with dev_stack(stack_options(tmp_path_factory.mktemp("console") / ".ksquad", SCRIPT)) as stack:
        await stack.runs.apply([agent(model) for model in SCRIPT])
        yield stack


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as started:
        yield started


@pytest.fixture
async def page(browser: Browser, dev: DevStack) -> AsyncIterator[tuple[Page, PageLog]]:
    context = await browser.new_context(viewport={"width": 1366, "height": 900})
    opened = await context.new_page()
    log = PageLog(opened)
    await opened.goto(dev.console_signin_url)
    await wait_for_text(opened, log, "Signed in as")
    yield opened, log
    await context.close()


def agent(model: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Agent",
        "metadata": {"name": model, "namespace": NS},
        "spec": {"modelEndpointRef": "local", "model": model},
    }


def run(name: str, model: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Run",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"agents": [model], "inputs": {"task": f"the task of {name}"}, **spec},
    }


def run_url(dev: DevStack, name: str) -> str:
    return f"{dev.api_url}/console/runs/{NS}/{name}"


async def phase_shown(page: Page, log: PageLog, phase: str, within_ms: int = 90_000) -> None:
    """The run page's own badge says `phase` (the page follows the run's events and renders itself again)."""
    await page.wait_for_function(
        "(phase) => document.querySelector('h1 [data-testid=phase]')?.textContent.startsWith(phase)",
        arg=phase,
        timeout=within_ms,
    )


async def test_a_run_is_followed_live_from_pending_to_succeeded(
    page: tuple[Page, PageLog], dev: DevStack
) -> None:
    tab, log = page
    await tab.goto(f"{dev.api_url}/console/?namespace={NS}")
    await dev.runs.apply([run("followed", "steady")])
    # the runs table refreshes itself: the new run appears without a reload
    await wait_for_text(tab, log, "followed", live=True)
    await tab.click("text=followed")
    await phase_shown(tab, log, "Running")
    await tab.screenshot(path=str(SHOTS / "run-running.png"), full_page=True)
    await phase_shown(tab, log, "Succeeded")
    await wait_for_text(tab, log, "the flaky test now freezes its clock")
    timeline = await tab.inner_text("#timeline")
    for phase in ("Pending", "Claiming", "Running", "Succeeded"):
        assert phase in timeline, timeline
    assert "model calls" in await tab.inner_text("[data-testid=usage]")
    await tab.screenshot(path=str(SHOTS / "run-succeeded.png"), full_page=True)


async def test_a_rate_limited_run_counts_down_then_resumes(page: tuple[Page, PageLog], dev: DevStack) -> None:
    tab, log = page
    await dev.runs.apply([run("limited-run", "limited")])
    await tab.goto(run_url(dev, "limited-run"))
    await phase_shown(tab, log, "Paused")
    await wait_for_text(tab, log, "RateLimited")
    first = await tab.inner_text("[data-testid=countdown]")
    assert first.startswith("(in "), first
    await tab.screenshot(path=str(SHOTS / "run-paused-countdown.png"), full_page=True)
    await asyncio.sleep(2)
    later = await tab.inner_text("[data-testid=countdown]")
    assert later != first, f"the countdown did not move: {first} then {later}"
    await phase_shown(tab, log, "Succeeded")
    await wait_for_text(tab, log, "answered after the limit")


async def test_an_agents_question_is_answered_from_the_page(
    page: tuple[Page, PageLog], dev: DevStack
) -> None:
    tab, log = page
    await dev.runs.apply([run("asked", "asks")])
    await tab.goto(run_url(dev, "asked"))
    await phase_shown(tab, log, "Paused")
    await wait_for_text(tab, log, "Which test is flaky?")
    await tab.screenshot(path=str(SHOTS / "run-asks.png"), full_page=True)
    await tab.fill("textarea[name=text]", "test_payment_retry, it reads the clock")
    await tab.click("[data-testid=action-input]")
    await wait_for_text(tab, log, "Answer sent")
    await phase_shown(tab, log, "Succeeded")
    assert dev.scripted is not None
    answered = [c for c in dev.scripted.calls if c.model == "asks"][-1]
    said = answered.tool_results + answered.context  # the answer comes back as the question tool's result
    assert any("test_payment_retry, it reads the clock" in text for text in said), said
    await wait_for_text(tab, log, "fixed the test you named")


async def test_a_run_is_cancelled_from_the_page(page: tuple[Page, PageLog], dev: DevStack) -> None:
    tab, log = page
    await dev.runs.apply([run("to-cancel", "slow")])
    await tab.goto(run_url(dev, "to-cancel"))
    await phase_shown(tab, log, "Running")
    await tab.fill("form[action$='/cancel'] input[name=reason]", "not needed any more")
    await tab.click("[data-testid=action-cancel]")
    await wait_for_text(tab, log, "Cancel sent")
    await phase_shown(tab, log, "Cancelled")
    assert await tab.is_disabled("text=Cancel the run")
    assert "the run has ended" in await tab.inner_text("[data-testid=why-not-cancel]")
    assert await wait_terminal(dev, ["to-cancel"], within=30) == {"to-cancel": "Cancelled"}


async def test_a_comment_on_the_work_item_is_read_by_the_next_attempt(
    page: tuple[Page, PageLog], dev: DevStack
) -> None:
    tab, log = page
    await dev.store.create_item(
        NS, "PAY-10", title="test_payment_retry is flaky", body="One run in ten.", created_by=dev.runs.user
    )
    retry = {"backoffSeconds": 20, "maxBackoffSeconds": 20}
    await dev.runs.apply([run("on-item", "fails-once", workItemRef="PAY-10", retryPolicy=retry)])
    await tab.goto(run_url(dev, "on-item"))
    await wait_for_text(tab, log, "RetryBackoff")  # the first attempt failed; the retry waits its backoff
    await tab.click("text=PAY-10")
    await wait_for_text(tab, log, "Attempt 1 of run")
    await tab.fill("#comment", "Look at the clock the test reads.")
    await tab.click("[data-testid=add-comment]")
    await wait_for_text(tab, log, "Comment added")
    thread = await tab.inner_text("[data-testid=thread]")
    assert f"{dev.runs.user} (person)" in thread and "Look at the clock the test reads." in thread, thread
    await tab.screenshot(path=str(SHOTS / "work-item.png"), full_page=True)
    assert await wait_terminal(dev, ["on-item"], within=90) == {"on-item": "Succeeded"}
    assert dev.scripted is not None
    second = [c for c in dev.scripted.calls if c.model == "fails-once"][-1]
    assert any("Look at the clock the test reads." in text for text in second.context), second.context


async def texts_of_memory(tab: Page) -> list[str]:
    """The entries' text as the page shows it, in its edit boxes (newest first)."""
    found: list[str] = await tab.eval_on_selector_all(
        "[data-testid=memory-entry] textarea", "boxes => boxes.map(box => box.value)"
    )
    return found


async def test_a_teams_memory_is_read_searched_edited_and_added_to_from_the_page(
    page: tuple[Page, PageLog], dev: DevStack
) -> None:
    """The Memory link, the namespace's Teams, a Team's memory with what a Run of it remembered (attributed to the
    Run), found by text; an entry added, edited and deleted as the developer; the next Run of the Team reads it."""
    tab, log = page
    await dev.runs.apply(
        [{"apiVersion": API, "kind": "Team", "metadata": {"name": "squad", "namespace": NS}, "spec": {}}]
    )
    await dev.store.remember(
        NS,
        "teams",
        "squad",
        "decision",
        "Never sleep in tests",
        Author(user=dev.runs.user, run=f"{NS}/earlier", run_uid="u", attempt=1),
    )
    await tab.click("nav >> text=Memory")
    await tab.fill("#m-namespace", NS)
    await tab.click("text=Show")
    await tab.click("text=Team squad")
    await wait_for_text(tab, log, "Memory of Team squad")
    shown = await tab.inner_text("[data-testid=memory]")
    assert f"{NS}/earlier (agent, attempt 1, for {dev.runs.user})" in shown, shown
    assert await texts_of_memory(tab) == ["Never sleep in tests"]
    await tab.fill("#memory-text", f"The retry test reads the wall clock {PAYLOAD}")
    await tab.select_option("#kind-new", "fact")
    await tab.click("[data-testid=memory-add]")
    await wait_for_text(tab, log, "Entry added")
    await tab.fill("[data-testid=memory-search]", "WALL CLOCK")
    await tab.click("button:has-text('Search')")
    entries = tab.locator("[data-testid=memory-entry]")
    assert await entries.count() == 1
    await entries.first.locator("textarea").fill("The retry test reads the wall clock: freeze it")
    await entries.first.locator("[data-testid=memory-save]").click()
    await wait_for_text(tab, log, "Entry saved")
    shown = await tab.inner_text("[data-testid=memory]")
    assert f"edited by {dev.runs.user}" in shown, shown
    assert await texts_of_memory(tab) == [
        "The retry test reads the wall clock: freeze it",
        "Never sleep in tests",
    ]
    await tab.screenshot(path=str(SHOTS / "memory.png"), full_page=True)
    await (
        tab.locator("[data-testid=memory-entry]", has_text="Never sleep")
        .locator("[data-testid=memory-delete]")
        .click()
    )
    await wait_for_text(tab, log, "Entry deleted")
    assert [e.text for e in await dev.store.memory(NS, "teams", "squad")] == [
        "The retry test reads the wall clock: freeze it"
    ]
    assert await tab.evaluate("window.pwned") is None

    await dev.runs.apply([run("with-memory", "quick", teamRef="squad")])
    assert await wait_terminal(dev, ["with-memory"], within=90) == {"with-memory": "Succeeded"}
    assert dev.scripted is not None
    read = [c for c in dev.scripted.calls if c.model == "quick"][-1]
    assert any("freeze it" in text for text in read.context), read.context


async def test_a_run_started_from_the_console_carries_the_person(
    page: tuple[Page, PageLog], dev: DevStack
) -> None:
    tab, log = page
    await dev.store.create_item(NS, "PAY-11", title="a second flaky test", created_by=dev.runs.user)
    await tab.goto(f"{dev.api_url}/console/start?namespace={NS}")
    await tab.select_option("#s-target", "agent:quick")
    await tab.fill("#s-name", "started-here")
    await tab.fill("#s-item", "PAY-11")
    await tab.fill("#s-inputs", "task=fix the second flaky test\npriority=high")
    await tab.screenshot(path=str(SHOTS / "start.png"), full_page=True)
    await tab.click("[data-testid=start]")
    await wait_for_text(tab, log, "Run created")
    await phase_shown(tab, log, "Succeeded")
    person = dev.runs.user
    assert ((await dev.runs.get(NS, "started-here")).status or {}).get("triggeredBy") == person
    assert person in await tab.inner_text(".facts")
    entries = await dev.store.item_events(NS, "PAY-11", 0)
    by_agent = {e.author.user for e in entries if e.author.run and e.kind != "ended"}  # "ended": ksquad's own
    assert by_agent == {person}, "the agent wrote for the person"
    usage = await dev.store.usage("triggered_by", since=datetime.now(UTC) - timedelta(hours=1), namespace=NS)
    assert any(row.key == person and row.calls >= 1 for row in usage), usage
    # a bad input line is refused with the field named, and nothing is created
    await tab.goto(f"{dev.api_url}/console/start?namespace={NS}")
    await tab.select_option("#s-target", "agent:quick")
    await tab.fill("#s-name", "refused-here")
    await tab.fill("#s-inputs", "no equals sign here")
    await tab.click("[data-testid=start]")
    await wait_for_text(tab, log, "inputs, line 1")
    assert await dev.runs.objects.get("Run", NS, "refused-here") is None
    await tab.goto(f"{dev.api_url}/console/?namespace={NS}&person={person}")
    await wait_for_text(tab, log, "started-here")
    await tab.screenshot(path=str(SHOTS / "runs.png"), full_page=True)


async def test_markup_and_script_from_runs_agents_and_people_run_nothing(
    browser: Browser, dev: DevStack
) -> None:
    await dev.store.create_item(
        NS, "XSS-1", title=f"title {PAYLOAD}", body=f"body {PAYLOAD}", created_by=dev.runs.user
    )
    await dev.runs.apply(
        [
            {
                **run("hostile-run", "hostile", workItemRef="XSS-1"),
                "spec": {"agents": ["hostile"], "workItemRef": "XSS-1", "inputs": {"task": PAYLOAD}},
            }
        ]
    )
    assert await wait_terminal(dev, ["hostile-run"], within=60) == {"hostile-run": "Succeeded"}
    token = (dev.state_dir / TOKEN_FILE).read_text().strip()
    async with httpx.AsyncClient(base_url=dev.api_url, headers={"Authorization": f"Bearer {token}"}) as api:
        made = await api.post(f"/items/{NS}/XSS-1/comments", json={"body": f"comment {PAYLOAD}"})
        assert made.status_code == 201, made.text

    context = await browser.new_context()
    tab = await context.new_page()
    log = PageLog(tab)
    foreign, dialogs = [], []
    own = dev.api_url.split("//", 1)[1]
    tab.on("request", lambda r: foreign.append(r.url) if own not in r.url else None)
    tab.on("dialog", lambda d: dialogs.append(d.message))
    await tab.goto(dev.console_signin_url)
    for address, shown in (
        (run_url(dev, "hostile-run"), f"answer {PAYLOAD}"),
        (f"{dev.api_url}/console/items/{NS}/XSS-1", f"comment {PAYLOAD}"),
        (f"{dev.api_url}/console/?namespace={NS}", "hostile-run"),
    ):
        await tab.goto(address)
        await wait_for_text(tab, log, shown.split('"')[0])  # the payload, shown as the text it is
        await asyncio.sleep(1)
        assert await tab.evaluate("window.pwned") is None, f"a script of the payload ran on {address}"
        assert await tab.locator("img").count() == 0, f"the payload made an element on {address}"
    assert foreign == [] and dialogs == [], (foreign, dialogs)
    policy = (await tab.request.get(run_url(dev, "hostile-run"))).headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy, policy
    await context.close()


async def test_a_form_without_its_token_or_from_another_origin_changes_nothing(dev: DevStack) -> None:
    token = (dev.state_dir / TOKEN_FILE).read_text().strip()
    await dev.runs.apply([run("kept", "slow")])
    async with httpx.AsyncClient(base_url=dev.api_url, follow_redirects=False) as http:
        signed = await http.get(f"/console/signin?token={token}")
        assert signed.status_code == 303
        no_token = await http.post(f"/console/runs/{NS}/kept/cancel", data={"reason": "forged"})
        assert no_token.status_code == 403 and "stale" in no_token.text, no_token.text
        elsewhere = await http.post(
            f"/console/runs/{NS}/kept/cancel",
            data={"reason": "forged", "csrf": "x"},
            headers={"Origin": "http://attacker.invalid"},
        )
        assert elsewhere.status_code == 403, elsewhere.text
    async with httpx.AsyncClient(base_url=dev.api_url) as stranger:  # no session cookie
        nobody = await stranger.get(f"/console/runs/{NS}/kept")
        assert nobody.status_code == 401 and "Sign in" in nobody.text
    status = (await dev.runs.get(NS, "kept")).status or {}
    assert status.get("phase") not in ("Cancelling", "Cancelled"), status
    await dev.runs.signal(NS, "kept", RunSignal.CANCEL, "the test is done with it")

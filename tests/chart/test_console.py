"""The console on the installed chart (ksquad-api's /console/), in Debian's Chromium, as two people of one team
meet it, each with their own Kubernetes identity:
- carol, who may start and steer Runs, arrives through an authenticating proxy (the browser's requests carry her
  bearer token, as oauth2-proxy adds it): she starts a Run from the page, follows it to Succeeded, finds herself
  on it as a kubectl-created Run would carry her, comments on its work item, and cancels a second run;
- dave, who may only read, signs in with his token on the console's own page: he sees the same runs and the item,
  and every action is refused on the page with the reason (the API server's answer for him), and a forged
  request changes nothing.
Carol's Run page links the Run's trace in the trace UI (the chart's tracing.traceUrl).
Screenshots of both views land in test-output/console/."""

from collections.abc import AsyncIterator

import httpx
import pytest
from playwright.async_api import Browser, Page

import tracing
from testbed.agents import ModelEndpoint
from testbed.jaeger import Jaeger, wait_trace
from tests.chart.conftest import API_URL, NS, Release, phase_of
from tests.chart.test_api import MODEL, squad, start_run
from tests.support.browser import CONSOLE_SHOTS as SHOTS
from tests.support.browser import PageLog, chromium, wait_for_text

ITEM = "CONSOLE-1"


def person(release: Release, name: str, verbs: str, clusterrole: str) -> str:
    """A ServiceAccount of the Run namespace standing for a person: `verbs` on Runs, read on Agents and Teams,
    Kubernetes' `clusterrole` there (work items come with it); its token."""
    release.kubectl("-n", NS, "create", "serviceaccount", name)
    release.kubectl(
        "-n", NS, "create", "role", f"{name}-runs", f"--verb={verbs}", "--resource=runs.ksquad.io"
    )
    release.kubectl(
        "-n",
        NS,
        "create",
        "role",
        f"{name}-agents",
        "--verb=get,list",
        "--resource=agents.ksquad.io,teams.ksquad.io",
    )
    for role in (f"{name}-runs", f"{name}-agents"):
        release.kubectl(
            "-n", NS, "create", "rolebinding", role, f"--role={role}", f"--serviceaccount={NS}:{name}"
        )
    release.kubectl(
        "-n",
        NS,
        "create",
        "rolebinding",
        f"{name}-{clusterrole}",
        f"--clusterrole={clusterrole}",
        f"--serviceaccount={NS}:{name}",
    )
    return release.kubectl("-n", NS, "create", "token", name, "--duration=1h").stdout.strip()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    async with chromium() as started:
        yield started


async def badge(page: Page, phase: str, within_ms: int = 240_000) -> None:
    await page.wait_for_function(
        "(phase) => document.querySelector('h1 [data-testid=phase]')?.textContent.startsWith(phase)",
        arg=phase,
        timeout=within_ms,
    )


async def test_two_people_each_see_and_do_what_kubernetes_lets_them(
    release: Release, model: ModelEndpoint, browser: Browser, chart_jaeger: Jaeger
) -> None:
    model.script(MODEL, {"text": "done from the console"})
    squad(release, model)
    carol_token = person(release, "carol", "get,list,watch,create,patch", "edit")
    dave_token = person(release, "dave", "get,list,watch", "view")
    carol_user, dave_user = f"system:serviceaccount:{NS}:carol", f"system:serviceaccount:{NS}:dave"
    await release.store.create_item(NS, ITEM, title="the console's item", created_by=carol_user)

    # carol, behind the proxy: her token on every request
    carol = await browser.new_context(extra_http_headers={"Authorization": f"Bearer {carol_token}"})
    tab = await carol.new_page()
    log = PageLog(tab)
    await tab.goto(f"{API_URL}/console/start?namespace={NS}")
    await wait_for_text(tab, log, f"Signed in as {carol_user}")
    await tab.select_option("#s-target", "agent:api-agent")
    await tab.fill("#s-name", "from-the-console")
    await tab.fill("#s-item", ITEM)
    await tab.fill("#s-inputs", "task=fix the flaky test")
    await tab.click("[data-testid=start]")
    await wait_for_text(tab, log, "Run created")
    await badge(tab, "Succeeded")
    await wait_for_text(tab, log, "done from the console")
    run = release.run("from-the-console")
    assert run["metadata"]["annotations"]["ksquad.io/triggered-by"] == carol_user, (
        "stamped as kubectl's would be"
    )
    assert run["status"]["triggeredBy"] == carol_user
    # The Run's trace, one click away (the chart's tracing.traceUrl), and in the trace UI's store.
    trace_id = f"{tracing.trace_id(run['metadata']['uid']):032x}"
    assert (
        await tab.get_attribute("[data-testid=traces] a", "href")
        == f"{chart_jaeger.query_url}/trace/{trace_id}"
    )
    assert await wait_trace(chart_jaeger, trace_id, "reconcile Run: start")
    await tab.screenshot(path=str(SHOTS / "cluster-carol-run.png"), full_page=True)

    await tab.click(f"text={ITEM}")
    await tab.fill("#comment", "carol was here")
    await tab.click("[data-testid=add-comment]")
    await wait_for_text(tab, log, "Comment added")
    entries = await release.store.item_events(NS, ITEM, 0)
    comments = [(e.author.user, e.body) for e in entries if e.kind == "comment" and e.author.run is None]
    assert comments == [(carol_user, "carol was here")], comments

    model.script(MODEL, {"delay": 600, "text": "never"})
    start_run(release, "to-cancel", "a long task")
    await tab.goto(f"{API_URL}/console/runs/{NS}/to-cancel")
    await badge(tab, "Running")
    await tab.click("[data-testid=action-cancel]")
    await badge(tab, "Cancelled")
    assert release.run("to-cancel")["metadata"]["annotations"]["ksquad.io/cancel-requested"]

    # dave signs in with his token on the console's page; he may read, not act
    dave = await browser.new_context()
    view = await dave.new_page()
    dave_log = PageLog(view)
    await view.goto(f"{API_URL}/console/")
    await view.fill("#token", dave_token)
    await view.click("[data-testid=signin]")
    await wait_for_text(view, dave_log, f"Signed in as {dave_user}")
    await view.goto(f"{API_URL}/console/?namespace={NS}")
    await wait_for_text(view, dave_log, "from-the-console")
    await view.screenshot(path=str(SHOTS / "cluster-dave-runs.png"), full_page=True)
    # A Run started meanwhile appears on his open runs page, told by ksquad-api's watch (its own ServiceAccount's
    # list and watch of the namespace's Runs), the table read again as dave
    start_run(release, "dave-watches", "another long task")
    await wait_for_text(view, dave_log, "dave-watches", live=True)
    await view.goto(f"{API_URL}/console/runs/{NS}/dave-watches")
    await badge(view, "Running")
    why = await view.inner_text("[data-testid=why-not-cancel]")
    assert why == f"{dave_user} may not patch runs.ksquad.io dave-watches in namespace {NS}", why
    await view.screenshot(path=str(SHOTS / "cluster-dave-run.png"), full_page=True)
    await view.goto(f"{API_URL}/console/items/{NS}/{ITEM}")
    await wait_for_text(view, dave_log, "carol was here")
    assert "may not update workitems" in await view.inner_text("[data-testid=why-not-comment]")
    await view.goto(f"{API_URL}/console/start?namespace={NS}")
    assert "may not create runs" in await view.inner_text("[data-testid=why-not-start]")

    # a forged cancel in dave's session: no form token, and none he could make; the Run goes on
    cookies = {c["name"]: c["value"] for c in await dave.cookies()}
    async with httpx.AsyncClient(base_url=API_URL, cookies=cookies) as http:
        forged = await http.post(f"/console/runs/{NS}/dave-watches/cancel", data={"csrf": "guess"})
    assert forged.status_code == 403, forged.text
    assert "ksquad.io/cancel-requested" not in (
        release.run("dave-watches")["metadata"].get("annotations") or {}
    )
    release.kubectl(
        "-n", NS, "annotate", "run", "dave-watches", "ksquad.io/cancel-requested=the test is done"
    )
    await phase_of(release, "dave-watches", {"Cancelled"})
    await carol.close()
    await dave.close()

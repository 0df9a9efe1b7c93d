"""The work item as the coordination record on the installed chart: a person (a namespace `edit`or, through the
CLI and ksquad-api) makes an item and comments; a Run on it fails its first attempt, whose agent, in a sandbox,
reads the item through ksquad-api with its item token (the sandbox's NetworkPolicy lets it reach the API and
nothing else of the cluster) and says on the item that it failed; the retry, in a new sandbox, reads that,
succeeds, publishes its answer to the item and marks it done. Each entry is attributed. A write with the first
attempt's fence after the retry claimed is refused with 409 and is not in the item; the retry's token reaches
no other item; a user who may read Runs but not work items is refused, and the CLI says so."""

import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx

from agent.callers import ItemAccess, item_token, read_key
from store import work_item_key
from testbed.agents import ModelEndpoint
from tests.chart.conftest import API_URL, HOME, NS, RELEASE, Release, grant, phase_of
from tests.chart.test_api import MODEL, account, squad, start_run
from tests.support.dev import ksquad

ITEM = "PAY-9"


def editor(release: Release, name: str) -> tuple[str, Path]:
    """A ServiceAccount of the Run namespace bound to Kubernetes' `edit` there, as a team member is: its token and
    a kubeconfig with it. Work items come with `edit` (the chart's aggregated ClusterRoles)."""
    release.kubectl("-n", NS, "create", "serviceaccount", name)
    grant(release, name, f"{name}-edit", clusterrole="edit")
    token = release.kubectl("-n", NS, "create", "token", name, "--duration=1h").stdout.strip()
    return token, release.cluster.token_kubeconfig(f"items-{name}", token, NS)


async def test_two_attempts_and_a_person_write_one_items_record_and_a_stale_holder_writes_nothing(
    release: Release, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script(MODEL, {"error": 500}, {"text": "froze the clock in the test"})
    squad(release, model)
    person_token, person = editor(release, "person")
    reader_token, reader = account(release, "runs-reader", can_get_runs=True)
    cli = ("-n", NS, "--kubeconfig", str(person), "--api", API_URL)
    made = await ksquad(tmp_path, "items", "create", ITEM, "--title", "test_payment_retry is flaky", *cli)
    assert made.code == 0, made.err
    said = await ksquad(tmp_path, "items", "comment", ITEM, "Look at the clock the test reads.", *cli)
    assert said.code == 0, said.err
    other = await ksquad(tmp_path, "items", "create", "OTHER-1", "--title", "not this run's", *cli)
    assert other.code == 0, other.err

    start_run(
        release,
        "fix-pay-9",
        "Fix the flaky test.",
        workItemRef=ITEM,
        retryPolicy={"backoffSeconds": 1, "maxBackoffSeconds": 1},
    )
    status = (await phase_of(release, "fix-pay-9", {"Succeeded", "Failed"}, timeout=300))["status"]
    assert status["phase"] == "Succeeded" and status["attempt"] == 2, status
    run = release.run("fix-pay-9")
    starter = run["metadata"]["annotations"]["ksquad.io/triggered-by"]

    shown = await ksquad(tmp_path, "items", "get", ITEM, "-o", "json", *cli)
    assert shown.code == 0, shown.err
    item: dict[str, Any] = json.loads(shown.out)
    entries = item["entries"]
    person_user = f"system:serviceaccount:{NS}:person"
    comments = [
        (e["author"].get("user"), e["author"].get("attempt"), e["body"])
        for e in entries
        if e["kind"] in ("created", "comment")
    ]
    assert comments[:2] == [
        (person_user, None, "test_payment_retry is flaky"),
        (person_user, None, "Look at the clock the test reads."),
    ]
    assert [c[:2] for c in comments[2:]] == [(starter, 1), (starter, 2)], comments
    assert "failed: " in comments[2][2] and "HTTP 500" in comments[2][2], comments[2]
    assert (
        comments[3][2]
        == f"Attempt 2 of run {NS}/fix-pay-9 finished: its answer is the Run's (its status and its artifact `answer`)"
    )
    states = [(e["author"].get("attempt"), e["data"]["state"]) for e in entries if e["kind"] == "state"]
    assert states == [(1, "in-progress"), (2, "done")]
    published = [(e["author"].get("attempt"), e["data"]["name"]) for e in entries if e["kind"] == "artifact"]
    assert published == [(2, "answer")]
    assert all(e["author"].get("run") == f"{NS}/fix-pay-9" for e in entries if e["author"].get("attempt"))
    assert item["state"] == "done"
    retry = [c for c in model.state.calls if c.model == MODEL][-1]
    assert any("Attempt 1 of run" in text and "HTTP 500" in text for text in retry.context), retry.context
    assert any("Look at the clock the test reads." in text for text in retry.context)

    # Tokens as the worker makes them, with the chart's key: attempt 1's (its fence, now stale) and attempt 2's.
    key_file = tmp_path / "item-token-key"
    key_file.write_bytes(
        base64.b64decode(release.get("secret", "-n", HOME, f"{RELEASE}-item-token-key")["data"]["key"])
    )
    key = read_key(key_file)  # as the worker and ksquad-api read it
    fences = [c.fence for c in await release.store.claim_history(work_item_key(NS, ITEM))]
    expires = int(time.time()) + 600

    def token(attempt: int, fence: int) -> dict[str, str]:
        access = ItemAccess(NS, ITEM, f"{NS}/fix-pay-9", run["metadata"]["uid"], attempt, fence, expires)
        return {"Authorization": f"Bearer {item_token(key, access)}"}

    async with httpx.AsyncClient(base_url=API_URL, timeout=30) as http:
        late = await http.post(
            f"/items/{NS}/{ITEM}/comments", json={"body": "late"}, headers=token(1, fences[0])
        )
        assert late.status_code == 409 and "no longer holds" in late.json()["error"], late.text
        for method, path in (("GET", "OTHER-1"), ("POST", "OTHER-1/comments")):
            elsewhere = await http.request(
                method, f"/items/{NS}/{path}", json={"body": "x"}, headers=token(2, fences[-1])
            )
            assert elsewhere.status_code == 403, elsewhere.text
            assert f"reaches its work item {NS}/{ITEM} only" in elsewhere.json()["error"]
        listed = await http.get(f"/items/{NS}", headers=token(2, fences[-1]))
        assert listed.status_code == 403, "an attempt lists no items"
        after = await http.get(
            f"/items/{NS}/{ITEM}/entries", headers={"Authorization": f"Bearer {person_token}"}
        )
        as_reader = {"Authorization": f"Bearer {reader_token}"}
        for method, path in (("GET", f"/items/{NS}"), ("GET", f"/items/{NS}/{ITEM}/entries")):
            unread = await http.request(method, path, headers=as_reader)
            assert unread.status_code == 403, unread.text
        run_read = await http.get(f"/runs/{NS}/fix-pay-9/artifacts/answer", headers=as_reader)
        assert run_read.status_code == 200, "the same user may read the Run itself"
    assert after.json()["entries"] == entries, "the stale write is not in the item"

    # Who may read Runs but not work items: refused by the API, and the CLI says so.
    refused = await ksquad(
        tmp_path, "items", "get", ITEM, "-n", NS, "--kubeconfig", str(reader), "--api", API_URL
    )
    assert refused.code != 0
    assert f"system:serviceaccount:{NS}:runs-reader may not get workitems.ksquad.io" in refused.err, (
        refused.err
    )

"""`make demo` (`ksquad dev --demo`): from nothing to the three runs in their end states, the seed's work item
done with what its run wrote, and a UI that answers."""

import re
from pathlib import Path

from tests.support.dev import FREE_PORTS, ksquad


async def test_the_demo_ends_with_each_run_as_expected_and_the_ui_answering(tmp_path: Path) -> None:
    result = await ksquad(tmp_path, "dev", "--demo", *FREE_PORTS, timeout=180)
    assert result.code == 0, result.out + result.err
    rows = {
        line.split()[0]: line.split()[1:4]
        for line in result.out.splitlines()
        if re.match(r"^(fix-flaky-tests|summarize-incident|migrate-ledger) ", line)
    }
    assert rows["fix-flaky-tests"][:2] == ["Succeeded", "Succeeded"]
    assert rows["summarize-incident"][:3] == ["Succeeded", "Succeeded", "2"], (
        "paused once, resumed on attempt 2"
    )
    assert rows["migrate-ledger"][:2] == ["Cancelled", "Cancelled"]
    assert re.search(r"summarize-incident +phase +Paused \(RateLimited\)", result.out)
    # the console and the UI answer the signed-in browser, through the API (dev.api)
    assert re.search(
        r"Console \(HTTP 200\): sign in with http://127\.0\.0\.1:\d+/console/signin\?token=", result.out
    )
    assert re.search(
        r"Temporal UI \(HTTP 200\): sign in with http://127\.0\.0\.1:\d+/ui/signin\?token=", result.out
    )
    # the seed's work item: the developer's comment, then the run's attempt reading it, commenting, finishing it
    item = result.out.split("work item ksquad-system/wi-8123, as `ksquad items get")[1].split("Temporal UI")[
        0
    ]
    assert re.search(r"wrote: It reads the wall clock", item), item
    assert re.search(r"ksquad-system/fix-flaky-tests attempt 1 +set it in-progress", item), item
    assert re.search(r"ksquad-system/fix-flaky-tests attempt 1 +wrote: Attempt 1 of run .* finished", item), (
        item
    )
    assert re.search(r"ksquad-system/fix-flaky-tests attempt 1 +set it done", item), item
    assert re.search(r"ksquad-system/fix-flaky-tests attempt 1 +published answer", item), item
    assert re.search(
        r"ksquad +recorded: ksquad-system/fix-flaky-tests ended Succeeded \(Succeeded\)", item
    ), item
    assert "all three runs ended as expected, and the work item is done" in result.out
    assert (tmp_path / ".ksquad" / "temporal.db").is_file()

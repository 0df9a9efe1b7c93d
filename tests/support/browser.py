"""Debian's Chromium under Playwright, as the UI tests drive it, and what a page that did not show a text did.

A UI test that times out waiting for a text says only "Timeout exceeded"; on CI there is no screenshot to look
at. `wait_for_text` says instead what the page showed and what it asked for that went wrong (failed requests,
error answers, console errors), so a slow or failed page on a clean clone can be read from the output.
"""

import asyncio
import shutil
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from playwright.async_api import Browser, ConsoleMessage, Page, Request, Response, async_playwright
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeout

# How long the UI may take to show a (decoded) text: it loads its scripts through a proxy, and under make test's
# two workers on 2 cores, with a cluster test starting pods beside it, that took over 30 s once.
UI_WAIT_MS = 90_000
# What a person should look at after a run (pages' screenshots) goes under test-output/, which CI keeps.
TEST_OUTPUT = Path(__file__).parents[2] / "test-output"
CONSOLE_SHOTS = TEST_OUTPUT / "console"
SLICE_MS = 5_000  # how often a wait looks at what went wrong meanwhile
PLAYWRIGHT_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless, closed on the way out."""
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is missing: `make test` installs it (apt-get install chromium)"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, args=PLAYWRIGHT_FLAGS)
        try:
            yield browser
        finally:
            await browser.close()


class PageLog:
    """What went wrong for a page since it was opened: failed requests, answers of 400 and above, console
    errors (each line short, the newest kept)."""

    KEEP = 30

    def __init__(self, page: Page) -> None:
        self.lines: list[str] = []
        self.network_changes = 0  # requests Chromium aborted because the machine's network changed
        page.on("requestfailed", self._failed)
        page.on("response", self._answered)
        page.on("console", self._console)

    def _add(self, line: str) -> None:
        self.lines = [*self.lines[-(self.KEEP - 1) :], line[:300]]

    def _failed(self, request: Request) -> None:
        if "ERR_NETWORK_CHANGED" in (request.failure or ""):
            self.network_changes += 1
        self._add(f"failed {request.method} {request.url}: {request.failure}")

    def _answered(self, response: Response) -> None:
        if response.status >= 400:
            self._add(f"{response.status} {response.request.method} {response.url}")

    def _console(self, message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            self._add(f"console {message.type}: {message.text}")


async def wait_for_text(
    page: Page,
    log: PageLog,
    text: str,
    screenshot: Path | None = None,
    timeout_ms: int = UI_WAIT_MS,
    live: bool = False,
) -> None:
    """Wait until `page` shows `text` (a Playwright text selector: a string or a /regular expression/), then
    take the `screenshot` if asked. A page that has not shown it after half the time is reloaded once, as its
    user would, and a warning (in pytest's summary) says what it showed; one that still does not fails with
    the page's address, what it showed and what `log` recorded. A page whose requests Chromium aborted because
    the network changed (net::ERR_NETWORK_CHANGED: the test bed's node adds interfaces as pods start) is
    reloaded when that happens, within the same time. `live`: the page must show it by itself, never reloaded
    (what a page that follows a stream promises)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline, halfway = started + timeout_ms / 1000, started + timeout_ms / 2000
    reloaded, changes_seen = False, 0
    try:
        while True:
            left_ms = int((deadline - loop.time()) * 1000)
            if left_ms <= 0:
                waited = int((loop.time() - started) * 1000)
                what = await what_went_wrong(page, log, text, waited)
                raise AssertionError(f"{'not even after a reload: ' if reloaded else ''}{what}")
            try:
                await page.wait_for_selector(f"text={text}", timeout=min(SLICE_MS, left_ms))
                return
            except PlaywrightTimeout:
                pass
            if live:
                continue
            if log.network_changes > changes_seen:
                changes_seen = log.network_changes
                await reload(page)
            elif not reloaded and loop.time() >= halfway:
                waited = int((loop.time() - started) * 1000)
                warnings.warn(f"reloaded: {await what_went_wrong(page, log, text, waited)}", stacklevel=2)
                await reload(page)
                reloaded = True
    finally:
        if screenshot is not None:
            await page.screenshot(path=str(screenshot), full_page=True)


async def reload(page: Page) -> None:
    """Reload; a reload that itself fails (the network changed again) is left to the next look."""
    try:
        await page.reload()
    except PlaywrightError as err:
        warnings.warn(f"a reload of {page.url} failed: {err.message[:200]}", stacklevel=2)


async def what_went_wrong(page: Page, log: PageLog, text: str, waited_ms: int) -> str:
    shown = " ".join((await page.inner_text("body")).split())
    return (
        f"{page.url} did not show {text!r} within {waited_ms / 1000:.0f} s.\n"
        f"It showed: {shown[:1500]}\n"
        "What went wrong for it:\n  " + ("\n  ".join(log.lines) or "nothing recorded")
    )

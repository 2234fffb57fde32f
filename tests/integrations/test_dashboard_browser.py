"""The dashboard in a real browser: Debian's chromium driven by Playwright (never a downloaded
browser). Each click is checked against the server; an XSS probe shows as text and never runs.

Skipped, with the reason, where chromium or Playwright is missing (`make test` installs both:
apt-get chromium when missing, Playwright through the test extra)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import echomq
from echomq.dashboard import Dashboard, DashboardServer
from echomq.testing import EmbeddedServer

from ..calibration import budget

CHROMIUM = os.environ.get("ECHOMQ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--headless=new", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed (pip install -e '.[test]')"
)
pytestmark = [
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"no chromium at {CHROMIUM} (Debian: apt-get install chromium)",
    ),
    pytest.mark.once,
]

Q = "browser"
XSS_ID = '<img src=x onerror="window.__xss=1">'
XSS_ERROR = '<script>window.__xss=2</script><img src=x onerror="window.__xss=3"> & friends'


def until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def page(server: EmbeddedServer, r: redis.Redis) -> Iterator[Any]:
    """A chromium page on a dashboard of the test server (one queue, sampled every 0.2 s)."""
    web = DashboardServer(Dashboard.from_url(server.url, queues=[Q], interval=0.2)).start()
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                tab.set_default_timeout(10_000)
                errors: list[str] = []
                tab.on("pageerror", lambda exc: errors.append(str(exc)))
                tab.on("dialog", lambda dialog: dialog.accept())  # "purge every dead job?" and any alert()
                tab.goto(web.url + "#queue=" + Q)
                tab.errors = errors
                yield tab
            finally:
                browser.close()
    finally:
        web.stop()


def row(tab: Any, table: str, job_id: str) -> Any:
    """The row of ``job_id`` in one of the detail tables, found by its data-job attribute."""
    return tab.locator(f"#{table} tbody tr").filter(has=tab.locator(f"button.id:text-is({job_id!r})"))


def test_the_dashboard_drives_the_queue(page: Any, client: echomq.Client) -> None:
    started = time.monotonic()
    tab = page
    # A job appears in the waiting list while the page is open, and is cancelled from it.
    client.enqueue(Q, b"p", job_id="appears")
    waiting = row(tab, "pending", "appears")
    waiting.wait_for()
    waiting.get_by_role("button", name="Cancel").click()
    until(lambda: (i := client.job(Q, "appears")) is not None and i.state == "cancelled", what="the cancel")
    waiting.wait_for(state="detached")

    # A running job shows its lease; Cancel asks its holder to stop.
    client.enqueue(Q, b"p", job_id="running")
    held = client.claim(Q, lease_ms=60_000)
    assert held is not None and held.id == "running"
    active = row(tab, "active", "running")
    active.wait_for()
    assert "s" in active.locator(".lease .left").inner_text()
    active.get_by_role("button", name="Cancel").click()
    until(lambda: (i := client.job(Q, "running")) is not None and i.cancel_requested, what="the request")
    active.locator(".pill.cancel").wait_for()
    assert active.locator(".pill.cancel").inner_text() == "cancelled from the dashboard"

    # A dead job whose id and error carry markup: shown as text, never run; Retry sends it back.
    client.enqueue(Q, b"p", job_id=XSS_ID)
    r_job = client.claim(Q, lease_ms=60_000)
    assert r_job is not None and r_job.id == XSS_ID
    assert client.fail(Q, XSS_ID, r_job.token, XSS_ERROR, max_attempts=1) == "dead"
    dead = row(tab, "dead", XSS_ID)
    dead.wait_for()
    assert dead.locator("button.id").inner_text() == XSS_ID
    assert dead.locator(".error-text").inner_text() == XSS_ERROR
    assert tab.locator("#dead img, #dead script, #queues img").count() == 0
    assert tab.evaluate("window.__xss") is None
    dead.get_by_role("button", name="Retry").click()
    until(lambda: (i := client.job(Q, XSS_ID)) is not None and i.state == "pending", what="the retry")
    row(tab, "pending", XSS_ID).wait_for()
    # Its details (a click on the id) are text too.
    row(tab, "pending", XSS_ID).locator("button.id").click()
    tab.locator("#job-title").wait_for()
    assert tab.locator("#job-title").inner_text() == f"job {XSS_ID}"
    assert XSS_ERROR in tab.locator("#job-fields").inner_text()
    assert tab.locator("#job-payload").is_hidden()  # payloads are not shown without --show-payloads

    # Pause and resume, from the queue's row.
    queue_row = tab.locator(f'#queues tr[data-queue="{Q}"]')
    queue_row.get_by_role("button", name="Pause").click()
    until(lambda: client.counts(Q).paused, what="the pause")
    queue_row.locator(".pill.paused").wait_for()
    queue_row.get_by_role("button", name="Resume").click()
    until(lambda: not client.counts(Q).paused, what="the resume")
    queue_row.locator(".pill.run").wait_for()

    # Purge every dead job (the page asks first; the fixture accepts).
    assert client.cancel(Q, XSS_ID) == "cancelled"  # out of the way: "doomed" is the next claim
    client.enqueue(Q, b"p", job_id="doomed")
    job = client.claim(Q, lease_ms=60_000)
    assert job is not None and job.id == "doomed"
    client.fail(Q, job.id, job.token, "boom", max_attempts=1)
    row(tab, "dead", "doomed").wait_for()
    tab.locator("#purge-all").click()
    until(lambda: client.job(Q, "doomed") is None, what="the purge")

    # A task job names its task in its row; a traceback keeps its lines (issue 42: they ran together).
    app = echomq.App(client, queue=Q)

    @app.task
    def charge(card: str) -> None: ...

    failing = charge.enqueue("4242")
    t_job = client.claim(Q, lease_ms=60_000)
    assert t_job is not None and t_job.id == failing.id
    trace = 'Traceback (most recent call last):\n  File "app.py", line 3\nValueError: declined\n'
    client.fail(Q, failing.id, t_job.token, "ValueError: declined", max_attempts=1, traceback=trace)
    task_row = row(tab, "dead", failing.id)
    task_row.wait_for()
    assert task_row.locator("td.task").inner_text() == "charge(...)"  # its arguments are payload: hidden
    task_row.locator("button.id").click()
    tab.locator("#job-traceback").wait_for()
    assert tab.locator("#job-traceback").inner_text().splitlines()[-1] == "ValueError: declined"
    assert len(tab.locator("#job-traceback").inner_text().splitlines()) == 3
    tab.locator("#job-close").click()

    # Finished jobs, on demand: "appears" was cancelled while it waited.
    tab.locator("#show-finished").click()
    finished = tab.locator('#finished tbody tr[data-job="appears"]')
    finished.wait_for()
    assert "cancelled" in finished.inner_text()

    assert tab.evaluate("window.__xss") is None
    assert tab.errors == []
    assert time.monotonic() - started < budget(60)


def test_read_only_shows_no_action(server: EmbeddedServer, client: echomq.Client) -> None:
    client.enqueue(Q, b"p", job_id="quiet")
    web = DashboardServer(Dashboard.from_url(server.url, queues=[Q], interval=0.2, read_only=True)).start()
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            tab = browser.new_page()
            tab.goto(web.url + "#queue=" + Q)
            row(tab, "pending", "quiet").wait_for()
            assert tab.locator("#mode").inner_text() == "read-only"
            assert tab.locator("button.action:not(.view)").count() == 0  # a view (Show finished) stays
            assert tab.locator("#retry-all, #purge-all").count() == 0
            assert tab.locator("#show-finished").count() == 1
            assert tab.evaluate("document.body.innerText").count("Cancel") == 0
            browser.close()
    finally:
        web.stop()


LONG_ID = "order-" + "0123456789abcdef" * 12  # 198 characters, no space to break at
LOCAL = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+0530"  # the page's zone below: Asia/Kolkata, +05:30


def test_no_csp_violation_long_ids_stay_in_their_panel_and_times_are_local(
    server: EmbeddedServer, client: echomq.Client
) -> None:
    # At e64777a each active job's lease bar broke the CSP every second (an inline style
    # attribute), a long id pushed the Waiting table's button out of its panel, and times
    # showed as raw epoch ms (the job's details) or UTC (the clock).
    client.enqueue(Q, b"p", job_id="running")
    held = client.claim(Q, lease_ms=60_000)
    assert held is not None and held.id == "running"
    client.enqueue(Q, b"p", job_id="dead-" + LONG_ID)
    doomed = client.claim(Q, lease_ms=60_000)
    assert doomed is not None
    client.fail(Q, doomed.id, doomed.token, "boom", max_attempts=1)
    client.enqueue(Q, b"p", job_id=LONG_ID)
    web = DashboardServer(Dashboard.from_url(server.url, queues=[Q], interval=0.2)).start()
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                tab = browser.new_page(viewport={"width": 1400, "height": 1000}, timezone_id="Asia/Kolkata")
                tab.set_default_timeout(10_000)
                console: list[str] = []
                tab.on("console", lambda message: console.append(message.text))
                tab.add_init_script(
                    "window.__csp = [];"
                    "document.addEventListener('securitypolicyviolation',"
                    " (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"
                )
                tab.goto(web.url + "#queue=" + Q)
                running = row(tab, "active", "running")
                running.wait_for()
                row(tab, "pending", LONG_ID).wait_for()
                row(tab, "dead", "dead-" + LONG_ID).wait_for()
                time.sleep(2.5)  # a few refreshes (one a second), each redrawing the lease bars
                assert tab.evaluate("window.__csp") == []
                assert not [line for line in console if "Content Security Policy" in line], console

                panel = until(tab.locator("#detail").bounding_box, what="the detail panel")
                for table, job_id, label in (
                    ("pending", LONG_ID, "Cancel"),
                    ("dead", "dead-" + LONG_ID, "Retry"),
                    ("active", "running", "Cancel"),
                ):
                    button = row(tab, table, job_id).get_by_role("button", name=label)
                    # None when a redraw replaced the row between finding and measuring it: again
                    box = until(button.bounding_box, what=f"the {label} button of {table}")
                    assert box["x"] + box["width"] <= panel["x"] + panel["width"], (table, box, panel)

                assert re.fullmatch(f"server time {LOCAL}", tab.locator("#clock").inner_text())
                died = row(tab, "dead", "dead-" + LONG_ID).locator("td.when")
                assert re.fullmatch(r"[0-9.]+ (ms|s) ago", died.inner_text())
                assert re.fullmatch(LOCAL, died.get_attribute("title") or "")
                running.locator("button.id").click()
                tab.locator("#job-title").wait_for()
                fields = tab.locator("#job-fields").inner_text()
                assert not re.search(r"\b1[0-9]{12}\b", fields), fields  # no raw epoch ms
                names = tab.locator("#job-fields dt").all_inner_texts()
                shown = dict(zip(names, tab.locator("#job-fields dd").all_inner_texts(), strict=True))
                for name in ("enqueued at", "claimed at", "lease deadline"):
                    assert re.fullmatch(rf"{LOCAL} \((in )?[0-9.]+ (ms|s)( ago)?\)", shown[name]), shown
                assert re.fullmatch(LOCAL, shown["server time"])
            finally:
                browser.close()
    finally:
        web.stop()

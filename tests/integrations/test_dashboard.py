"""The dashboard's server side over real HTTP (uvicorn in a thread, a real server behind it):
what it shows, and its security model (loopback, token, CSRF, read-only, payloads, headers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

import echomq
from echomq.cli import main
from echomq.dashboard import Dashboard, DashboardServer, is_loopback
from echomq.testing import EmbeddedServer

# Engine-independent (once): the dashboard over the client; its verbs are tests/verbs/'s, on every engine.
pytestmark = pytest.mark.once

Q = "board"
Start = Callable[..., DashboardServer]


@pytest.fixture
def start(server: EmbeddedServer) -> Iterator[Start]:
    """A dashboard on the test server, served on a free loopback port; stopped after the test."""
    started: list[DashboardServer] = []

    def run(host: str = "127.0.0.1", **settings: Any) -> DashboardServer:
        settings.setdefault("interval", 0.2)
        web = DashboardServer(Dashboard.from_url(server.url, **settings), host=host)
        started.append(web.start())
        return web

    yield run
    for web in started:
        web.stop()


def session(web: DashboardServer) -> tuple[httpx.Client, str]:
    """A browser-like session: the page sets the CSRF cookie, the page's meta tag holds the token."""
    http = httpx.Client(base_url=web.url, timeout=10)
    page = http.get("/")
    assert page.status_code == 200, page.text
    match = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert match
    return http, match.group(1)


def state(http: httpx.Client, queue: str | None = Q) -> dict[str, Any]:
    response = http.get("/api/state", params={"queue": queue} if queue else None)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_state_is_the_servers(start: Start, client: echomq.Client, r: redis.Redis) -> None:
    for i in range(4):
        client.enqueue(Q, b"secret payload", job_id=f"j{i}")
    held = client.claim(Q, lease_ms=30_000)
    assert held is not None
    client.cancel(Q, held.id, "stop it")
    web = start()
    http, _ = session(web)
    body = wait_for(lambda: s if (s := state(http))["queues"] else None)
    (queue,) = body["queues"]
    counts = client.counts(Q)
    assert queue["name"] == Q
    for name in ("pending", "delayed", "active", "lapsed", "dead", "paused"):
        assert queue["counts"][name] == getattr(counts, name), name
    selected = body["selected"]
    assert [j["id"] for j in selected["active"]] == [held.id]
    assert selected["active"][0]["cancel_reason"] == "stop it"
    assert [j["id"] for j in selected["pending"]] == ["j1", "j2", "j3"]
    assert set(selected["chart"]) == {"t", "throughput", "recoveries", "dead_letters"}
    assert "secret payload" not in http.get("/api/state", params={"queue": Q}).text


def test_payloads_are_hidden_unless_asked(start: Start, client: echomq.Client) -> None:
    client.enqueue(Q, b"card pan-xq-4111", job_id="pay")
    hidden, shown = start(), start(show_payloads=True)
    http, _ = session(hidden)
    info = http.get("/api/job", params={"queue": Q, "id": "pay"}).json()
    assert info["payload_size"] == len(b"card pan-xq-4111") and "payload" not in info
    assert "pan-xq" not in http.get("/api/job", params={"queue": Q, "id": "pay"}).text
    http, _ = session(shown)
    assert http.get("/api/job", params={"queue": Q, "id": "pay"}).json()["payload"] == "card pan-xq-4111"
    assert http.get("/api/job", params={"queue": Q, "id": "nope"}).status_code == 404


def test_a_jobs_result_is_hidden_as_its_payload_and_its_progress_shown(
    start: Start, client: echomq.Client
) -> None:
    client.enqueue(Q, b"p" * 100, job_id="r", priority=-3)
    job = client.claim(Q, 60_000)
    assert job is not None
    client.checkpoint(Q, "r", job.token, 60_000, progress="7/10")
    client.complete(Q, "r", job.token, result=b"secret result \xff" + b"x" * 100)
    http, _ = session(start())
    info = http.get("/api/job", params={"queue": Q, "id": "r"}).json()
    assert (info["priority"], info["progress"], info["result_size"]) == (-3, "7/10", 115)
    assert info["payload_size"] == 100 and "result" not in info and "secret" not in str(info)
    http, _ = session(start(show_payloads=True))
    info = http.get("/api/job", params={"queue": Q, "id": "r"}).json()
    assert info["result"].startswith("secret result \\xff") and not info["result_truncated"]


def test_actions_need_the_csrf_token_of_the_page(start: Start, client: echomq.Client) -> None:
    web = start()
    http, token = session(web)
    assert http.post("/api/action/pause", json={"queue": Q}).status_code == 403  # no header
    wrong = http.post("/api/action/pause", json={"queue": Q}, headers={"X-CSRF-Token": "forged"})
    assert wrong.status_code == 403
    assert not client.counts(Q).paused
    # A cross-site request carrying the right token still fails on the browser's own headers.
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://evil.example"}):
        refused = http.post("/api/action/pause", json={"queue": Q}, headers={"X-CSRF-Token": token} | headers)
        assert refused.status_code == 403, headers
    # Without the page's cookie the header alone is not enough (double submit).
    bare = httpx.post(f"{web.url}api/action/pause", json={"queue": Q}, headers={"X-CSRF-Token": token})
    assert bare.status_code == 403
    assert not client.counts(Q).paused
    origin = f"https://127.0.0.1:{web.port}"
    same_site = {"X-CSRF-Token": token, "Origin": origin, "Sec-Fetch-Site": "same-origin"}
    ok = http.post("/api/action/pause", json={"queue": Q}, headers=same_site)  # https: behind a TLS proxy
    assert ok.status_code == 200 and ok.json()["result"] == "paused"
    assert client.counts(Q).paused
    assert http.get("/api/action/resume").status_code == 405  # actions are POSTs only


def test_every_action_does_what_it_says(start: Start, client: echomq.Client) -> None:
    web = start()
    http, token = session(web)

    def post(action: str, **body: Any) -> httpx.Response:
        return http.post(f"/api/action/{action}", json={"queue": Q, **body}, headers={"X-CSRF-Token": token})

    client.enqueue(Q, b"p", job_id="waiting")
    assert post("cancel", id="waiting").json()["result"] == "cancelled"
    info = client.job(Q, "waiting")
    assert info is not None and info.state == "cancelled"
    assert info.cancel_reason == "cancelled from the dashboard"
    client.enqueue(Q, b"p", job_id="dies")
    job = client.claim(Q, lease_ms=30_000)
    assert job is not None
    client.fail(Q, job.id, job.token, "boom", max_attempts=1)
    assert post("retry", id="dies").json()["result"] == "pending"
    assert post("retry", id="dies").status_code == 409  # it is pending now: NotRetryable
    assert post("retry", id="ghost").status_code == 404
    job = client.claim(Q, lease_ms=30_000)
    assert job is not None
    client.fail(Q, job.id, job.token, "boom", max_attempts=1)
    assert post("purge-dead").json()["result"] == "purged 1"
    assert client.job(Q, "dies") is None
    assert post("pause").json()["result"] == "paused" and post("resume").json()["result"] == "resumed"
    assert post("cancel").status_code == 400  # no id
    assert post("explode").status_code == 404
    bad_name = http.post("/api/action/pause", json={"queue": "a{b"}, headers={"X-CSRF-Token": token})
    assert bad_name.status_code == 400


def test_read_only_refuses_and_hides_actions(start: Start, client: echomq.Client) -> None:
    web = start(read_only=True)
    http, token = session(web)
    assert '<meta name="read-only" content="true">' in http.get("/").text
    refused = http.post("/api/action/pause", json={"queue": Q}, headers={"X-CSRF-Token": token})
    assert refused.status_code == 403 and "read-only" in refused.json()["error"]
    assert not client.counts(Q).paused


def test_loopback_only_without_a_token(start: Start) -> None:
    web = start()
    # DNS rebinding: a page of another site whose name resolves to 127.0.0.1.
    rebound = httpx.get(f"{web.url}api/state", headers={"Host": f"evil.example:{web.port}"})
    assert rebound.status_code == 421
    assert httpx.get(f"{web.url}api/state", headers={"Host": f"localhost:{web.port}"}).status_code == 200
    with pytest.raises(ValueError, match="not loopback"):
        DashboardServer(Dashboard.from_url("redis://127.0.0.1:1"), host="0.0.0.0")
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("example.com")


def test_a_token_guards_every_request(start: Start) -> None:
    web = start(token="s3cret-token")
    for path in ("/", "/api/state", "/static/app.js", "/api/job?queue=q&id=x"):
        assert httpx.get(f"{web.url}{path.lstrip('/')}").status_code == 401, path
    assert httpx.get(f"{web.url}?token=wrong-token").status_code == 401
    bearer = httpx.get(f"{web.url}api/state", headers={"Authorization": "Bearer s3cret-token"})
    assert bearer.status_code == 200
    http = httpx.Client(base_url=web.url, timeout=10)
    login = http.get("/", params={"token": "s3cret-token"})
    assert login.status_code == 303 and login.headers["location"] == "/"  # the token leaves the address bar
    cookie = login.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert http.get("/").status_code == 200 and http.get("/api/state").status_code == 200
    with pytest.raises(ValueError, match="at least 8"):
        Dashboard.from_url("redis://127.0.0.1:1", token="short")


def test_every_response_carries_the_strict_headers(start: Start) -> None:
    web = start()
    http, _ = session(web)
    for path in ("/", "/static/app.js", "/static/app.css", "/api/state", "/static/nope.js"):
        response = http.get(path)
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"


def test_the_page_ships_its_own_assets_and_builds_text_only() -> None:
    from importlib import resources

    static = resources.files("echomq.dashboard").joinpath("static")
    page = static.joinpath("index.html").read_text()
    script = static.joinpath("app.js").read_text()
    assert "http" not in re.sub(r"http://www\.w3\.org/2000/svg", "", page + script)  # no CDN, no remote asset
    assert "innerHTML" not in script and "outerHTML" not in script and "insertAdjacentHTML" not in script
    assert "eval(" not in script and "document.write" not in script
    assert "<script>" not in page  # no inline script (the CSP would refuse it anyway)


def test_echomq_dashboard_refuses_a_public_address_without_a_token(
    server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    env_token = os.environ.pop("ECHOMQ_DASHBOARD_TOKEN", None)
    try:
        code = main(["--url", server.url, "dashboard", "--host", "0.0.0.0", "--port", "0", "--duration", "1"])
    finally:
        if env_token is not None:
            os.environ["ECHOMQ_DASHBOARD_TOKEN"] = env_token
    assert code == 1
    assert "not loopback" in capsys.readouterr().err


def test_echomq_dashboard_runs_as_a_command(server: EmbeddedServer, client: echomq.Client) -> None:
    client.enqueue("cli-q", b"p")
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "--url", server.url, "dashboard", "--port", "0", "--duration", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"(http://\S+/)", line)
        assert match, line
        http = httpx.Client(base_url=match.group(1), timeout=10)
        assert http.get("/").status_code == 200
        found = wait_for(lambda: [q["name"] for q in http.get("/api/state").json()["queues"]])
        assert found == ["cli-q"]
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def test_every_listing_names_a_jobs_task_and_its_arguments_only_with_payloads(
    start: Start, client: echomq.Client
) -> None:
    # Issue 42: the dashboard never showed a job's task; its arguments are payload, hidden by default.
    app = echomq.App(client, queue=Q)

    @app.task
    def charge(card: str, cents: int) -> None: ...

    waiting = charge.enqueue("pan-xq-4111", 500)
    charge.enqueue("4242", 1)
    raw = client.enqueue(Q, b"raw bytes")
    held = client.claim(Q, 60_000)  # the first: a charge
    assert held is not None and held.id == waiting.id
    trace = "Traceback\n  line 1\nE: x\n"
    client.fail(Q, held.id, held.token, "Declined: no", max_attempts=1, traceback=trace)
    hidden, shown = session(start())[0], session(start(show_payloads=True))[0]
    body = wait_for(lambda: s if (s := state(hidden))["selected"]["dead"] else None)
    tasks = {j["id"]: j["task"] for listing in ("pending", "dead") for j in body["selected"][listing]}
    assert tasks[waiting.id] == "charge(...)" and tasks[raw] is None
    assert "pan-xq" not in str(body)
    body = wait_for(lambda: s if (s := state(shown))["selected"]["dead"] else None)
    tasks = {j["id"]: j["task"] for listing in ("pending", "dead") for j in body["selected"][listing]}
    assert tasks[waiting.id] == 'charge("pan-xq-4111", 500)'
    info = hidden.get("/api/job", params={"queue": Q, "id": waiting.id}).json()
    assert info["task"] == "charge(...)" and info["traceback"] == "Traceback\n  line 1\nE: x\n"
    info = shown.get("/api/job", params={"queue": Q, "id": waiting.id}).json()
    assert info["task"] == 'charge("pan-xq-4111", 500)'


def test_finished_jobs_are_shown_on_demand_newest_first_with_their_task(
    start: Start, client: echomq.Client
) -> None:
    # Issue 42: done jobs were listed nowhere in the page; no set holds them, so a bounded scan
    # finds them when the page asks (never in the sampler).
    app = echomq.App(client, queue=Q)

    @app.task
    def send(to: str) -> None: ...

    for to in ("ada", "bob"):
        send.options(job_id=f"done-{to}").enqueue(to)
    client.enqueue(Q, b"raw", job_id="gone")
    for _ in range(3):
        job = client.claim(Q, 60_000)
        assert job is not None
        client.complete(Q, job.id, job.token)
        time.sleep(0.01)  # distinct finished_at, so "newest first" can be checked
    client.enqueue(Q, b"raw", job_id="waits")
    http, _ = session(start(read_only=True))  # a read: the read-only page has it too
    body = http.get("/api/finished", params={"queue": Q}).json()
    assert body["complete"] is True
    assert [j["id"] for j in body["finished"]] == ["gone", "done-bob", "done-ada"]
    assert [j["task"] for j in body["finished"]] == [None, "send(...)", "send(...)"]
    assert all(j["state"] == "done" for j in body["finished"])
    assert http.get("/api/finished").status_code == 400
    assert "show-finished" in http.get("/").text

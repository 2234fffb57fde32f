"""The dashboard's server side: a Starlette app over ``echomq.asyncio.Client``.

Why Starlette + uvicorn: the smallest well-kept ASGI pair (Starlette is
FastAPI's core; uvicorn the reference ASGI server), both pure Python wheels
with few dependencies (anyio, h11, click); asyncio fits the asyncio client,
and the app needs routing, responses and a lifespan, not a framework.  No
template engine: the page is static, and the data is JSON that the page's
script turns into text nodes.

Reads go through the client's read methods only (``counts``, ``counters``,
``pending``, ``active``, ``dead``, ``job``, ``queues``); actions through its
verbs (``pause``, ``resume``, ``cancel``, ``retry``, ``retry_dead``,
``purge_dead``).  One background task samples every queue each ``interval``
(however many browsers watch) and keeps the last minutes of counters for the
chart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import html
import ipaddress
import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("echomq.dashboard needs Starlette and uvicorn: pip install 'echomq[dashboard]'") from (
        exc
    )

from .. import asyncio as emq
from .._protocol import keys_of
from .._protocol.views import joined, piece_fields
from ..errors import EchoMQError, JobGone, NotRetryable
from ..keyspace import queue_keys
from ..tasks.describe import call_text

__all__ = ["Dashboard", "DashboardServer", "is_loopback"]

log = logging.getLogger("echomq.dashboard")

CSRF_COOKIE = "emq_csrf"
AUTH_COOKIE = "emq_auth"
CSRF_HEADER = "x-csrf-token"
TOKEN_ENV = "ECHOMQ_DASHBOARD_TOKEN"
PAYLOAD_LIMIT = 64 * 1024
FINISHED_SCAN = 20_000
"""The most keys one "Show finished" request's SCAN examines (the dashboard's only scan of rows)."""


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN MATCH pattern (a queue name may hold ``*``, ``?``, ``[``)."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


ACTIONS = ("pause", "resume", "cancel", "retry", "retry-dead", "purge-dead")

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The host part of a Host header (``127.0.0.1:8640`` → ``127.0.0.1``, ``[::1]:80`` → ``::1``)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass
class _QueueSample:
    """One queue as the sampler saw it last, and its counters over the last minutes."""

    name: str
    counts: dict[str, Any] = field(default_factory=dict)
    oldest_wait_ms: int = 0
    # (server ms, completed, recovered, dead-lettered), oldest first
    history: deque[tuple[int, int, int, int]] = field(default_factory=deque)
    error: str | None = None


def _rates(history: deque[tuple[int, int, int, int]], smooth_ms: int = 3000) -> dict[str, list[float]]:
    """Per-second rates over the last ``smooth_ms`` at each sample: throughput, recoveries, dead-letters."""
    out: dict[str, list[float]] = {"t": [], "throughput": [], "recoveries": [], "dead_letters": []}
    points = list(history)
    start = 0
    for t1, c1, r1, d1 in points[1:]:
        while start + 1 < len(points) and t1 - points[start + 1][0] >= smooth_ms:
            start += 1
        t0, c0, r0, d0 = points[start]
        span = (t1 - t0) / 1000
        if span <= 0:
            continue
        out["t"].append(t1)
        out["throughput"].append(round(max(0, c1 - c0) / span, 3))  # a reset (obliterate) is not negative
        out["recoveries"].append(round(max(0, r1 - r0) / span, 3))
        out["dead_letters"].append(round(max(0, d1 - d0) / span, 3))
    return out


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static").joinpath(name).read_bytes()


class Dashboard:
    """The dashboard over one server: its settings, its sampler, and its ASGI app (``app()``).

    ``Dashboard(client, *, queues=None, read_only=False, token=None,
    show_payloads=False, interval=1.0, history_seconds=600, max_queues=100,
    page_size=50, discover_every=5.0)``: ``client`` is an ``echomq.asyncio.Client``; ``queues``
    the queues to show (None: discover them in the queue registry every
    ``discover_every`` seconds, at most ``max_queues``, a queue found once
    stays listed); ``token``:
    when set, every request needs it (``?token=`` once, then a cookie; or
    ``Authorization: Bearer``).
    """

    def __init__(
        self,
        client: emq.Client,
        *,
        queues: list[str] | None = None,
        read_only: bool = False,
        token: str | None = None,
        show_payloads: bool = False,
        interval: float = 1.0,
        history_seconds: float = 600.0,
        max_queues: int = 100,
        page_size: int = 50,
        discover_every: float = 5.0,
    ) -> None:
        for name in queues or ():
            keys_of(name)  # a bad queue name fails now
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if token is not None and len(token) < 8:
            raise ValueError("the dashboard token must be at least 8 characters")
        self.client = client
        self.fixed = list(queues) if queues else None
        self.read_only, self.token, self.show_payloads = read_only, token, show_payloads
        self.interval, self.max_queues, self.page_size = interval, max_queues, page_size
        self.discover_every = discover_every
        self.history_seconds = history_seconds
        self._points = max(2, int(history_seconds / interval) + 1)
        self._samples: dict[str, _QueueSample] = {}
        self._discovered_at = -float("inf")
        self._server_time = 0
        self._error: str | None = None
        self._key = secrets.token_bytes(32)  # this process's cookie key: a restart signs everyone out

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **settings: Any) -> Dashboard:
        """A dashboard on the server at ``url`` (``echomq.asyncio.Client.from_url``)."""
        return cls(emq.Client.from_url(url, cluster=cluster), **settings)

    # -- sampling ------------------------------------------------------------------

    async def _queue_names(self) -> list[str]:
        if self.fixed is not None:
            return self.fixed
        if time.monotonic() - self._discovered_at >= self.discover_every:
            found = await self.client.queues(limit=self.max_queues)
            self._discovered_at = time.monotonic()
            for name in found:
                if name not in self._samples and len(self._samples) < self.max_queues:
                    self._samples[name] = _QueueSample(name)
        return sorted(self._samples)

    async def sample(self) -> None:
        """Read every queue's counts and counters once (the background task does, every ``interval``)."""
        try:
            names = await self._queue_names()
        except Exception as exc:
            self._error = f"cannot read the server: {exc}"
            log.warning("sampling failed: %r", exc)
            return
        self._error = None
        for name in names:
            sample = self._samples.setdefault(name, _QueueSample(name))
            try:
                counts = await self.client.counts(name)
                counters = await self.client.counters(name)
                head = await self.client.pending(name, count=1)
            except Exception as exc:
                sample.error = str(exc)
                continue
            sample.error = None
            self._server_time = counts.server_time
            sample.counts = {k: v for k, v in asdict(counts).items() if k != "server_time"}
            sample.counts.update(
                completed=counters.completed, recovered=counters.recovered, claimed=counters.claimed
            )
            sample.oldest_wait_ms = head[0].waiting_ms if head and not head[0].delayed else 0
            sample.history.append(
                (counters.server_time, counters.completed, counters.recovered, counters.dead_lettered)
            )
            while len(sample.history) > self._points:
                sample.history.popleft()

    async def _sampler(self, stop: asyncio.Event) -> None:
        # Ended by `stop`, not by a cancel alone: before Python 3.12, asyncio.wait_for (which
        # redis.asyncio sends commands through) returns normally when a cancel lands as the
        # command completes, so a cancel mid-request can be lost.
        while not stop.is_set():
            started = time.monotonic()
            await self.sample()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.05, self.interval - (time.monotonic() - started)))

    @staticmethod
    async def _stop_sampler(task: asyncio.Task[None], stop: asyncio.Event) -> None:
        stop.set()
        while not task.done():  # a lost cancel is sent again: a request can be long on a stalled server
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
        with contextlib.suppress(asyncio.CancelledError):
            task.result()

    # -- the app -------------------------------------------------------------------

    def app(self) -> Any:
        """The ASGI application (Starlette, wrapped with the security headers)."""

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            stop = asyncio.Event()
            task = asyncio.create_task(self._sampler(stop), name="echomq-dashboard-sampler")
            try:
                yield
            finally:
                await self._stop_sampler(task, stop)
                await self.client.aclose()

        routes = [
            Route("/", self._index, methods=["GET"]),
            Route("/static/{name}", self._asset, methods=["GET"]),
            Route("/api/state", self._state, methods=["GET"]),
            Route("/api/job", self._job, methods=["GET"]),
            Route("/api/finished", self._finished, methods=["GET"]),
            Route("/api/action/{action}", self._action, methods=["POST"]),
        ]
        return _SecurityHeaders(Starlette(routes=routes, lifespan=lifespan))

    # -- security ------------------------------------------------------------------

    def _session(self) -> str:
        return hmac.new(self._key, b"authenticated", hashlib.sha256).hexdigest()

    def _refused(self, request: Request) -> Response | None:
        """None when the request may go on, else the refusal."""
        if self.token is None:
            # Loopback only (the CLI refuses any other bind without a token): a page on another
            # site that resolves its own name to 127.0.0.1 (DNS rebinding) is refused here.
            if not is_loopback(_host_name(request.headers.get("host", ""))):
                return PlainTextResponse("this dashboard answers on its loopback address only", 421)
            return None
        bearer = request.headers.get("authorization", "")
        if bearer.startswith("Bearer ") and hmac.compare_digest(bearer[7:].encode(), self.token.encode()):
            return None
        cookie = request.cookies.get(AUTH_COOKIE, "")
        if cookie and hmac.compare_digest(cookie, self._session()):
            return None
        return PlainTextResponse("a token is required: open /?token=<token> once", 401)

    def _csrf_refused(self, request: Request) -> Response | None:
        site = request.headers.get("sec-fetch-site")
        if site is not None and site != "same-origin":
            return JSONResponse({"error": "cross-site request refused"}, 403)
        origin = request.headers.get("origin")
        # The host only: behind a TLS proxy the page's origin is https and this request's scheme http.
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
            return JSONResponse({"error": "cross-origin request refused"}, 403)
        cookie = request.cookies.get(CSRF_COOKIE, "")
        header = request.headers.get(CSRF_HEADER, "")
        if not cookie or not hmac.compare_digest(cookie, header):
            return JSONResponse({"error": "missing or wrong CSRF token: reload the page"}, 403)
        return None

    # -- endpoints -----------------------------------------------------------------

    async def _index(self, request: Request) -> Response:
        given = request.query_params.get("token")
        if self.token is not None and given is not None:
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return PlainTextResponse("wrong token", 401)
            response: Response = RedirectResponse("/", 303)  # the token leaves the address bar
            response.set_cookie(AUTH_COOKIE, self._session(), httponly=True, samesite="strict")
            return response
        refused = self._refused(request)
        if refused is not None:
            return refused
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        page = _static("index.html").decode()
        page = page.replace("{{csrf}}", html.escape(csrf, quote=True))
        page = page.replace("{{read_only}}", "true" if self.read_only else "false")
        response = Response(page, media_type="text/html; charset=utf-8")
        response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict")
        return response

    async def _asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        types = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
        if name not in types:
            return PlainTextResponse("not found", 404)
        refused = self._refused(request)
        return refused or Response(_static(name), media_type=types[name])

    def _queue_arg(self, name: str | None) -> str | None:
        if not name:
            return None
        keys_of(name)  # ValueError for a name that cannot be a queue
        if self.fixed is not None and name not in self.fixed:
            raise ValueError(f"queue {name!r} is not shown by this dashboard")
        return name

    def _guarded_queue(self, request: Request) -> tuple[str | None, Response | None]:
        """A read's ``?queue=`` if the request may read: (the queue or None, None), or (None, why not)."""
        refused = self._refused(request)
        if refused is not None:
            return None, refused
        try:
            return self._queue_arg(request.query_params.get("queue")), None
        except ValueError as exc:
            return None, JSONResponse({"error": str(exc)}, 400)

    async def _state(self, request: Request) -> Response:
        selected, refused = self._guarded_queue(request)
        if refused is not None:
            return refused
        queues = [
            {"name": s.name, "counts": s.counts, "oldest_wait_ms": s.oldest_wait_ms, "error": s.error}
            for s in sorted(self._samples.values(), key=lambda s: s.name)
            if s.counts or s.error
        ]
        state: dict[str, Any] = {
            "server_time": self._server_time,
            "read_only": self.read_only,
            "show_payloads": self.show_payloads,
            "error": self._error,
            "queues": queues,
            "selected": None,
        }
        if selected is not None:
            try:
                state["selected"] = await self._details(selected)
            except Exception as exc:
                state["error"] = f"cannot read queue {selected}: {exc}"
        return JSONResponse(state)

    async def _details(self, queue: str) -> dict[str, Any]:
        n = self.page_size
        active = await self.client.active(queue, count=n)
        pending_n = max(1, n // 4)
        pending = await self.client.pending(queue, count=pending_n)  # the head of the line
        dead = await self.client.dead(queue, count=n)
        sample = self._samples.get(queue)
        rows = {"active": [asdict(j) for j in active], "pending": [asdict(j) for j in pending]}
        rows["dead"] = [asdict(j) for j in dead]
        await self._name_tasks(queue, [row for listed in rows.values() for row in listed])
        return {
            "name": queue,
            **rows,
            "chart": _rates(sample.history) if sample is not None else _rates(deque()),
            "interval": self.interval,
            "window": self.history_seconds,
            "page_size": n,
            "pending_page_size": pending_n,
        }

    async def _finished(self, request: Request) -> Response:
        """The queue's newest finished rows (done, cancelled) still within their retention, on demand.

        No set holds finished jobs (their rows expire by themselves), so this
        is a bounded SCAN of the queue's rows: at most ``FINISHED_SCAN`` keys
        examined per request, only when the page asks (its "Show finished"
        button), never in the sampler.  On a queue with more rows than that,
        it shows those the scan met, said as ``complete: false``.
        """
        queue, refused = self._guarded_queue(request)
        if refused is not None:
            return refused
        if queue is None:
            return JSONResponse({"error": "give queue"}, 400)
        r, keys = self.client.redis, queue_keys(queue)
        prefix, cursor, seen, ids = keys.job(""), 0, 0, []
        while True:
            cursor, found = await r.scan(cursor, match=_glob_escape(prefix) + "*", count=500, _type="hash")
            seen += 500
            ids += [k.decode()[len(prefix) :] if isinstance(k, bytes) else k[len(prefix) :] for k in found]
            if cursor == 0 or seen >= FINISHED_SCAN:
                break
        ids = list(dict.fromkeys(ids))  # a SCAN may return a key twice
        pipe = r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(keys.job(job_id), ["state", "finished_at", "attempts", "last_error"])
        rows = []
        for job_id, (state, finished_at, attempts, error) in zip(ids, await pipe.execute(), strict=True):
            if state in (b"done", b"cancelled") and finished_at is not None:
                rows.append(
                    {
                        "id": job_id, "state": state.decode(), "finished_at": int(finished_at),
                        "attempts": int(attempts or 0),
                        "last_error": (error or b"").decode("utf-8", "replace"),
                    }
                )  # fmt: skip
        rows.sort(key=lambda row: row["finished_at"], reverse=True)
        rows = rows[: self.page_size]
        await self._name_tasks(queue, rows)
        return JSONResponse({"queue": queue, "finished": rows, "complete": cursor == 0})

    async def _name_tasks(self, queue: str, rows: list[dict[str, Any]]) -> None:
        """Each listed job's task (``task``: ``add(2, 3)``, arguments only with ``show_payloads``).

        One round trip for the page: the payload's head is read (a pieced
        payload's pieces too, at most 1 KiB); a raw job's ``task`` is None.
        """
        if not rows:
            return
        keys, fields = queue_keys(queue), piece_fields("payload")
        pipe = self.client.redis.pipeline(transaction=False)
        for row in rows:
            pipe.hmget(keys.job(row["id"]), fields)
        for row, values in zip(rows, await pipe.execute(), strict=True):
            row["task"] = call_text(joined(values), 60, arguments=self.show_payloads)

    async def _job(self, request: Request) -> Response:
        queue, refused = self._guarded_queue(request)
        if refused is not None:
            return refused
        job_id = request.query_params.get("id")
        if queue is None or job_id is None:
            return JSONResponse({"error": "give queue and id"}, 400)
        info = await self.client.job(queue, job_id, payload=self.show_payloads)
        if info is None:
            return JSONResponse({"error": f"no job {job_id!r} in queue {queue!r}"}, 404)
        out = asdict(info)
        payload, result, progress = out.pop("payload"), out.pop("result"), out.pop("progress")
        if payload is None:  # the task's name is shown whatever show_payloads says; its arguments are not
            values = await self.client.redis.hmget(queue_keys(queue).job(job_id), piece_fields("payload"))
            out = {"task": call_text(joined(values), 120, arguments=False), **out}
        else:
            out = {"task": call_text(payload, 120), **out}
        if self.show_payloads and payload is not None:
            out["payload"] = payload[:PAYLOAD_LIMIT].decode("utf-8", "backslashreplace")
            out["payload_truncated"] = len(payload) > PAYLOAD_LIMIT
        # A result is the job's output: shown as the payload is (its size always); a progress is
        # meant for anyone to read.
        out["result_size"] = len(result) if result is not None else None
        if self.show_payloads and result is not None:
            out["result"] = result[:PAYLOAD_LIMIT].decode("utf-8", "backslashreplace")
            out["result_truncated"] = len(result) > PAYLOAD_LIMIT
        if progress:
            out["progress"] = progress[:PAYLOAD_LIMIT].decode("utf-8", "backslashreplace")
        else:
            out["progress"] = progress
        return JSONResponse(out)

    async def _action(self, request: Request) -> Response:
        refused = self._refused(request) or self._csrf_refused(request)
        if refused is not None:
            return refused
        action = request.path_params["action"]
        if self.read_only:
            return JSONResponse({"error": "this dashboard is read-only"}, 403)
        if action not in ACTIONS:
            return JSONResponse({"error": f"unknown action {action!r}"}, 404)
        try:
            body = json.loads(await request.body() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            queue = self._queue_arg(body.get("queue"))
            if queue is None:
                raise ValueError("give the queue")
            job_id = body.get("id")
            if action in ("cancel", "retry") and not isinstance(job_id, str):
                raise ValueError("give the job id")
            result = await self._run(action, queue, job_id, body.get("reason"))
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": str(exc)}, 400)
        except JobGone:
            return JSONResponse({"error": f"no job {job_id!r} in queue {queue!r}"}, 404)
        except (NotRetryable, EchoMQError) as exc:
            return JSONResponse({"error": str(exc)}, 409)
        extra = {"echomq_queue": queue, "echomq_job": job_id, "echomq_attempt": None}
        about = f" job {job_id}" if job_id else ""
        log.info("dashboard: %s %s%s: %s", action, queue, about, result, extra=extra)
        return JSONResponse({"ok": True, "result": result})

    async def _run(self, action: str, queue: str, job_id: str | None, reason: Any) -> str:
        c = self.client
        if action == "pause":
            return "paused" if await c.pause(queue) else "already paused"
        if action == "resume":
            return "resumed" if await c.resume(queue) else "was not paused"
        if action == "cancel":
            assert job_id is not None
            text = reason if isinstance(reason, str) and reason else "cancelled from the dashboard"
            return await c.cancel(queue, job_id, text[:500])
        if action == "retry":
            assert job_id is not None
            await c.retry(queue, job_id)
            return "pending"
        if action == "retry-dead":
            done = await c.retry_dead(queue)
            return f"retried {done.retried}"
        purged = await c.purge_dead(queue)
        return f"purged {purged}"


class _SecurityHeaders:
    """ASGI middleware: the same strict headers on every response (CSP: no inline script, no CDN)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class DashboardServer:
    """uvicorn serving a ``Dashboard`` from a background thread (tests, scripts, the demo).

    ``DashboardServer(dashboard, host="127.0.0.1", port=0)``: port 0 picks a
    free one; ``url`` is where it answers once ``start()`` returned.  A host
    other than loopback needs the dashboard's token (``ValueError``).
    """

    def __init__(self, dashboard: Dashboard, host: str = "127.0.0.1", port: int = 0) -> None:
        if not is_loopback(host) and dashboard.token is None:
            raise ValueError(
                f"the dashboard binds {host}, which is not loopback: give it a token "
                f"(--token or ${TOKEN_ENV})"
            )
        self.dashboard, self.host = dashboard, host
        config = uvicorn.Config(
            dashboard.app(),
            host=host,
            port=port,
            log_config=None,  # echomq's (or the caller's) logging setup, not uvicorn's own
            access_log=False,
            proxy_headers=False,
            server_header=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        for server in self.server.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        raise RuntimeError("the dashboard is not serving yet")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self, timeout: float = 15.0) -> DashboardServer:
        """Serve from a daemon thread; returns once it accepts connections."""
        self._thread = threading.Thread(target=self.server.run, name="echomq-dashboard", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)  # the graceful shutdown gives connections 2 s
            if self._thread.is_alive():  # a connection or task that would not end: stop anyway
                self.server.force_exit = True
                self._thread.join(timeout=5)

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

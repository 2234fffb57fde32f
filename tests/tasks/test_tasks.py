"""The task layer (issue 29): tasks by name, results waited for without polling, errors that teach.

On both backends (``pytest.mark.backends``): a task enqueued by name from this process runs in a
worker started from the CLI in another; ``handle.result()`` waits on ``<base>done:<id>`` (the
commands a wait sends are counted); a NonRetryable failure is dead after one try, its traceback
stored and logged; a ``sys.exit`` task ends dead after its tries; a result over
``emq.max-result-bytes`` fails its job with nothing stored; per-task settings in a worker serving
several tasks; progress others can read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.tasks import PICKLE, SerializationError
from echomq.testing import EmbeddedServer

from ..faults import pythonpath, wait_until
from .test_results import SMALL, small  # noqa: F401 (a fixture)

# Engine-independent (once): the task layer over the client; its verbs are tests/verbs/'s, on every engine.
pytestmark = [pytest.mark.backends, pytest.mark.once]

Backend = Literal["module", "scripts"]

ROOT = Path(__file__).resolve().parents[2]

TASKS = """
import os, sys
import echomq

app = echomq.App(echomq.Client.from_url(os.environ["ECHOMQ_URL"]), queue="cli-mail")


@app.task
def add(a: int, b: int) -> int:
    return a + b


@app.task(queue="cli-other", max_attempts=2)
def leave() -> None:
    sys.exit(3)
"""


def quick(app: echomq.App, **settings: Any) -> echomq.tasks.TaskWorker:
    return app.worker(poll_interval=0.02, grace=0.5, **settings)


def test_a_task_runs_and_its_typed_result_comes_back(client: echomq.Client) -> None:
    app = echomq.App(client, queue="mail")

    @app.task(max_attempts=2)
    def send(to: str, *, subject: str = "") -> dict[str, str]:
        return {"to": to, "subject": subject}

    handle = send.options(job_id="welcome-ada").enqueue("ada@example.com", subject="hi")
    assert handle.id == "welcome-ada" and handle.queue == "mail"
    info = client.job("mail", "welcome-ada", payload=True)
    assert info is not None and info.payload == b'task send json\n[["ada@example.com"],{"subject":"hi"}]'
    with quick(app):
        assert handle.result(timeout=20) == {"to": "ada@example.com", "subject": "hi"}
    assert client.result("mail", "welcome-ada", timeout=0.5) == {"to": "ada@example.com", "subject": "hi"}
    done = client.job("mail", "welcome-ada")
    assert (
        done is not None
        and done.state == "done"
        and done.result == b'json\n{"to":"ada@example.com","subject":"hi"}'
    )


def test_enqueue_options_never_collide_with_the_functions_own_keywords(client: echomq.Client) -> None:
    app = echomq.App(client, queue="opts")

    @app.task
    def schedule(job_id: str, delay_ms: int, priority: int) -> int:  # the options' own names, as arguments
        return delay_ms + priority

    handle = schedule.options(delay_ms=60_000, priority=5).enqueue("x", delay_ms=1, priority=2)
    info = client.job("opts", handle.id, payload=True)
    assert info is not None and info.due_at is not None and info.priority == 5
    assert info.payload is not None and info.payload.endswith(b'[["x"],{"delay_ms":1,"priority":2}]')


def test_what_json_cannot_carry_is_refused_by_name_and_nothing_is_sent(client: echomq.Client) -> None:
    app = echomq.App(client, queue="json")

    @app.task
    def f(a: object, b: object = None) -> None: ...

    with pytest.raises(SerializationError, match=r"argument b=.*JSON cannot carry a builtins.set"):
        f.enqueue(1, b={1, 2})
    with pytest.raises(SerializationError, match="argument 1"):
        f.enqueue(float("nan"))
    assert client.counts("json").pending == 0


def test_enqueue_by_name_unknown_task_fails_dead_at_once_never_dropped(client: echomq.Client) -> None:
    # No retry by the same worker can find a task it does not have (issue 42): dead on the first try.
    producer = echomq.App(client, queue="named")
    handle = producer.enqueue("not_here", 1)
    worker_app = echomq.App(client, queue="named")

    @worker_app.task
    def other() -> None: ...

    with quick(worker_app, max_attempts=3), pytest.raises(echomq.JobFailed) as failed:
        handle.result(timeout=20)
    assert failed.value.type == "UnknownTask" and "no task 'not_here'" in failed.value.message
    info = client.job("named", handle.id)
    assert info is not None and info.state == "dead" and info.tries == 1


def test_an_unknown_task_is_retried_when_the_app_says_so(client: echomq.Client) -> None:
    # A rolling deploy: an older worker that lacks a new task leaves its job to the newer ones.
    handle = echomq.App(client, queue="named-retry").enqueue("not_here")
    worker_app = echomq.App(client, queue="named-retry", retry_unknown_tasks=True)

    @worker_app.task
    def other() -> None: ...

    with quick(worker_app, max_attempts=2), pytest.raises(echomq.JobFailed) as failed:
        handle.result(timeout=20)
    assert failed.value.type == "UnknownTaskRetried" and "no task 'not_here'" in failed.value.message
    info = client.job("named-retry", handle.id)
    assert info is not None and info.state == "dead" and info.tries == 2


def test_arguments_that_cannot_bind_are_refused_at_enqueue_and_dead_at_once_in_the_worker(
    client: echomq.Client,
) -> None:
    app = echomq.App(client, queue="binds")

    @app.task(max_attempts=3)
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(TypeError, match=r"task 'add': missing a required argument: 'b'"):
        app.enqueue("add", 1)  # the producer knows the task: nothing is sent
    with pytest.raises(TypeError, match=r"task 'add': got an unexpected keyword argument 'c'"):
        add.enqueue(1, 2, c=3)  # type: ignore[call-arg]
    assert client.counts("binds").pending == 0
    stranger = echomq.App(client, queue="binds").enqueue("add", 1, 2, 3)  # a producer that only has the name
    with quick(app), pytest.raises(echomq.JobFailed) as failed:
        stranger.result(timeout=20)
    assert failed.value.type == "BadArguments" and "too many positional arguments" in failed.value.message
    info = client.job("binds", stranger.id)
    assert info is not None and info.state == "dead" and info.tries == 1


def test_a_call_shape_that_bound_once_does_not_let_another_through(client: echomq.Client) -> None:
    # The worker keeps the call shapes that bound (positional count, keyword names): a shape it has
    # not seen is checked, even with the same number of arguments as one that bound.
    app = echomq.App(client, queue="shapes")

    @app.task(max_attempts=3)
    def add(a: int, b: int) -> int:
        return a + b

    stranger = echomq.App(client, queue="shapes")
    good = [stranger.enqueue("add", a=1, b=2), stranger.enqueue("add", 1, b=2), stranger.enqueue("add", 1, 2)]
    bad = stranger.enqueue("add", a=1, c=2)
    again = stranger.enqueue("add", b=5, a=1)
    with quick(app):
        assert [handle.result(timeout=20) for handle in good] == [3, 3, 3]
        with pytest.raises(echomq.JobFailed) as failed:
            bad.result(timeout=20)
        assert again.result(timeout=20) == 6
    assert failed.value.type == "BadArguments" and "missing a required argument: 'b'" in failed.value.message


def test_a_retry_policys_default_attempts_do_not_count_as_given(client: echomq.Client) -> None:
    app = echomq.App(client, queue="policy")
    policy = echomq.RetryPolicy(backoff="fixed", base_ms=0)

    @app.task(max_attempts=4, retry=policy)
    def flaky() -> None:
        raise RuntimeError("again")

    assert flaky.settings.retry is not None and flaky.settings.retry.max_attempts == 4
    with pytest.raises(ValueError, match="max_attempts=4 and retry's max_attempts=5: give one"):
        app.task(name="other", max_attempts=4, retry=echomq.RetryPolicy.exponential(max_attempts=5))(
            lambda: None
        )
    handle = flaky.enqueue()
    with quick(app), pytest.raises(echomq.JobFailed):
        handle.result(timeout=20)
    info = client.job("policy", handle.id)
    assert info is not None and info.tries == 4
    worker = echomq.Worker(client, "policy", lambda ctx: None, max_attempts=4, retry=policy)
    assert worker.max_attempts == 4


def test_errors_name_a_job_by_its_id_not_the_enqueue_reply(client: echomq.Client) -> None:
    app = echomq.App(client, queue="names")

    @app.task
    def slow() -> None: ...

    handle = slow.enqueue()
    assert isinstance(handle.id, echomq.Enqueued)
    with pytest.raises(echomq.ResultTimeout) as waited:
        handle.result(timeout=0.05)
    assert str(waited.value) == f"job '{handle.id}' of queue 'names' has not ended within 0.05 s"
    assert "Enqueued(" not in repr(handle) and type(waited.value.job_id) is str
    failed = echomq.JobFailed("names", handle.id, "E", "m", None)
    assert "Enqueued(" not in str(failed) and type(failed.job_id) is str


def test_non_retryable_is_dead_after_one_try_with_its_traceback_stored_and_logged(
    client: echomq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    app = echomq.App(client, queue="nonretry")

    @app.task(max_attempts=5)
    def charge(card: str) -> None:
        raise echomq.NonRetryable(f"card {card} was declined")

    handle = charge.enqueue("4242")
    log = caplog.at_level(logging.ERROR, logger="echomq.worker")
    with log, quick(app), pytest.raises(echomq.JobFailed) as failed:
        handle.result(timeout=20)
    exc = failed.value
    assert exc.type == "NonRetryable" and exc.message == "card 4242 was declined"
    assert (
        exc.traceback is not None
        and "in charge" in exc.traceback
        and exc.traceback.endswith("echomq.errors.NonRetryable: card 4242 was declined\n")
    )
    info = client.job("nonretry", handle.id)
    assert info is not None and info.state == "dead" and info.tries == 1 and info.traceback == exc.traceback
    logged = [r for r in caplog.records if r.levelno == logging.ERROR and handle.id in r.getMessage()]
    assert logged and "in charge" in logged[0].getMessage()


def test_retry_later_delays_the_job_and_uses_a_try(client: echomq.Client) -> None:
    app = echomq.App(client, queue="later")
    runs: list[int] = []

    @app.task(max_attempts=3)
    def poll() -> None:
        runs.append(1)
        raise echomq.RetryLater("not ready", delay_ms=600_000)

    handle = poll.enqueue()
    with quick(app):
        assert wait_until(
            lambda: (i := client.job("later", handle.id)) is not None and i.due_at is not None, 20
        )
    info = client.job("later", handle.id)
    assert info is not None and info.state == "pending" and info.tries == 1 and runs == [1]
    assert info.due_at is not None and info.due_at - info.server_time > 500_000
    assert info.last_error == "RetryLater: not ready"


def test_per_task_settings_apply_per_job_in_one_worker(client: echomq.Client) -> None:
    app = echomq.App(client, queue="mixed")

    @app.task(max_attempts=1, timeout_ms=200)
    def slow() -> None:
        echomq.task_context().cancel.sleep(30)  # wakes at the task's own timeout
        echomq.task_context().raise_if_cancelled()

    @app.task(max_attempts=4)
    def flaky() -> None:
        raise RuntimeError("upstream 500")

    s, f = slow.enqueue(), flaky.enqueue()
    with quick(app, max_attempts=2):
        with pytest.raises(echomq.JobFailed) as timed_out:
            s.result(timeout=20)
        with pytest.raises(echomq.JobFailed):
            f.result(timeout=20)
    assert timed_out.value.type == "TimeoutError" and "200 ms" in timed_out.value.message
    slow_info, flaky_info = client.job("mixed", s.id), client.job("mixed", f.id)
    assert slow_info is not None and slow_info.tries == 1  # its own max_attempts, not the worker's 2
    assert flaky_info is not None and flaky_info.tries == 4  # its own, not the worker's 2


def test_a_sys_exit_task_fails_a_try_each_time_and_ends_dead(client: echomq.Client) -> None:
    app = echomq.App(client, queue="exits")

    @app.task(max_attempts=2)
    def leave() -> None:
        sys.exit(3)

    handle = leave.enqueue()
    for _ in range(2):  # each run fails the job once (a try used) and stops, as sys.exit asks
        with pytest.raises(SystemExit):
            quick(app).run(handle_signals=False)
    with pytest.raises(echomq.JobFailed) as failed:
        handle.result(timeout=5)
    assert failed.value.type == "SystemExit" and failed.value.message == "3"
    assert failed.value.traceback is not None and "sys.exit(3)" in failed.value.traceback


def test_a_result_over_the_ceiling_fails_the_job_and_nothing_is_stored(
    small: echomq.Client,  # noqa: F811 (the fixture)
) -> None:
    app = echomq.App(small, queue="q")

    @app.task(max_attempts=1)
    def big() -> str:
        return "x" * SMALL

    handle = big.enqueue()
    with quick(app), pytest.raises(echomq.JobFailed) as failed:
        handle.result(timeout=20)
    assert failed.value.type == "ResultTooLarge" and "emq.max-result-bytes" in failed.value.message
    info = small.job("q", handle.id)
    assert info is not None and info.state == "dead" and info.result is None


def test_progress_is_readable_while_the_task_runs(client: echomq.Client) -> None:
    app = echomq.App(client, queue="prog")
    go = threading.Event()

    @app.task
    def export(pages: int) -> int:
        for page in range(pages):
            echomq.task_context().progress({"page": page + 1, "of": pages})
        go.wait(20)
        return pages

    handle = export.enqueue(3)
    with quick(app):
        assert wait_until(lambda: (i := handle.info()) is not None and i.progress == b'{"page":3,"of":3}', 20)
        go.set()
        assert handle.result(timeout=20) == 3


def test_a_cancelled_job_and_a_timeout_are_told_apart(client: echomq.Client) -> None:
    app = echomq.App(client, queue="cancel")

    @app.task
    def never() -> None: ...

    handle = never.enqueue()
    with pytest.raises(echomq.ResultTimeout) as timed_out:
        handle.result(timeout=0.3)
    assert isinstance(timed_out.value, TimeoutError)
    handle.cancel("not needed")
    with pytest.raises(echomq.JobCancelled) as cancelled:
        handle.result(timeout=5)
    assert cancelled.value.reason == "not needed" and isinstance(cancelled.value, echomq.Cancelled)
    with pytest.raises(echomq.JobGone):
        client.result("cancel", "no-such-job", timeout=1)


class Counting(redis.Connection):
    """A real connection that counts the commands it sends (the test reads the count)."""

    sent: ClassVar[list[str]] = []

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        Counting.sent.append(str(args[0]).upper())
        super().send_command(*args, **kwargs)  # type: ignore[no-untyped-call]


def test_a_wait_sends_a_subscription_and_one_read_per_announcement_not_a_poll(
    server: EmbeddedServer, client: echomq.Client, backend: Backend
) -> None:
    app = echomq.App(client, queue="count")

    @app.task
    def later() -> int:
        return 7

    handle = later.enqueue()
    waiter = echomq.Client(
        redis.Redis(connection_pool=redis.ConnectionPool(port=server.port, connection_class=Counting)),
        backend=backend,
    )
    Counting.sent.clear()
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(waiter.result("count", handle.id, timeout=30)))
    thread.start()
    assert wait_until(lambda: "HMGET" in Counting.sent, 10)
    time.sleep(1.5)  # a poll would show here
    before = list(Counting.sent)
    with quick(app):
        thread.join(20)
    assert got == [7]
    # Besides a new connection's handshake and the server's INFO (once per client): a subscription,
    # one read, then nothing while it waits; one read after the announcement, and the unsubscribe.
    handshake = ("HELLO", "CLIENT", "INFO")
    waited = [c for c in before if c not in handshake]
    if waited[:1] == ["GET"]:  # the queue's partition declaration, read once a client and queue
        waited = waited[1:]
    assert waited in (["SSUBSCRIBE", "HMGET"], ["SUBSCRIBE", "HMGET"]), before
    after = [c for c in Counting.sent[len(before) :] if c not in handshake]
    assert after[0] == "HMGET" and after[1:] in ([], ["SUNSUBSCRIBE"], ["UNSUBSCRIBE"]), after


def test_pickle_is_opt_in_on_both_sides(client: echomq.Client) -> None:
    app = echomq.App(client, queue="pickled", serializer=PICKLE)

    @app.task
    def pair(a: object) -> object:
        return (a, a)

    handle = pair.enqueue({1, 2})
    with quick(app):
        assert handle.result(timeout=20) == ({1, 2}, {1, 2})
    with pytest.raises(echomq.tasks.BadTaskPayload, match="'pickle' form"):
        client.result("pickled", handle.id, timeout=1)  # a JSON reader never unpickles


def test_asyncio_app_runs_async_and_sync_tasks(server: EmbeddedServer, backend: Backend) -> None:
    async def main() -> None:
        client = emq.Client(redis.asyncio.Redis(port=server.port), backend=backend)
        app = emq.App(client, queue="aio")

        @app.task
        async def double(x: int) -> int:
            await emq.task_context().progress({"x": x})
            return 2 * x

        @app.task(max_attempts=1)
        def fails() -> None:
            raise echomq.NonRetryable("no")

        a, b = await double.enqueue(21), await fails.enqueue()
        named = await app.enqueue("double", 4)
        worker = app.worker(poll_interval=0.02, grace=0.5)
        running = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            assert await a.result(timeout=20) == 42
            assert await named.result(timeout=20) == 8
            with pytest.raises(echomq.JobFailed) as failed:
                await b.result(timeout=20)
            assert failed.value.type == "NonRetryable"
            assert await client.result("aio", a.id, timeout=1) == 42
        finally:
            worker.stop()
            await running
            await client.aclose()

    asyncio.run(main())


@pytest.fixture
def tasks_module(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "clitasks.py").write_text(TASKS)
    yield tmp_path


def cli_worker(server: EmbeddedServer, where: Path, backend: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env.update(PYTHONPATH=pythonpath(ROOT / "python", where), ECHOMQ_URL=server.url)
    return subprocess.Popen(
        [sys.executable, "-m", "echomq", "worker", "clitasks:app", "--backend", backend, "--grace", "0",
         "--poll-interval", "0.05", "--no-metrics"],
        cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_tasks_enqueued_by_name_run_in_a_cli_worker_of_another_process(
    server: EmbeddedServer, client: echomq.Client, backend: str, tasks_module: Path
) -> None:
    producer = echomq.App(client, queue="cli-mail")  # knows no task: names only
    add = producer.enqueue("add", 2, 3)
    proc = cli_worker(server, tasks_module, backend)
    try:
        assert add.result(timeout=30) == 5
        # Only now: `leave` stops the worker of both queues, and, run first, it would give `add`
        # back unrun (it did once, on a loaded machine).
        leave = producer.options(queue="cli-other").enqueue("leave")
        _, err = proc.communicate(timeout=30)  # `leave` stops the whole worker by itself
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 3, err  # `leave` called sys.exit(3): its job failed a try, the worker exited
    assert "SystemExit: 3" in err and "Traceback" in err
    proc = cli_worker(server, tasks_module, backend)  # a second worker: the job's last try
    try:
        with pytest.raises(echomq.JobFailed) as failed:
            leave.result(timeout=30)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert failed.value.type == "SystemExit" and "sys.exit(3)" in (failed.value.traceback or "")
    done = subprocess.run(
        [sys.executable, "-m", "echomq", "result", "cli-mail", add.id, "--backend", backend],
        env={**os.environ, "ECHOMQ_URL": server.url, "PYTHONPATH": pythonpath(ROOT / "python")},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "5\n", done.stderr
    dead = subprocess.run(
        [sys.executable, "-m", "echomq", "result", "cli-other", leave.id, "--wait", "1",
         "--backend", backend],
        env={**os.environ, "ECHOMQ_URL": server.url, "PYTHONPATH": pythonpath(ROOT / "python")},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert dead.returncode == 1 and "SystemExit: 3" in dead.stderr and "sys.exit(3)" in dead.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "echomq", "dead", "cli-other", "--traceback", "--backend", backend],
        env={**os.environ, "ECHOMQ_URL": server.url, "PYTHONPATH": pythonpath(ROOT / "python")},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert listed.returncode == 0 and f"job {leave.id}: SystemExit: 3" in listed.stdout
    assert "sys.exit(3)" in listed.stdout


def test_the_raw_worker_stores_tracebacks_from_the_handlers_frames_and_honours_non_retryable(
    client: echomq.Client,
) -> None:
    client.enqueue("raw", b"x", "j")

    def handler(ctx: echomq.JobContext) -> None:
        raise echomq.NonRetryable(f"cannot take {ctx.payload!r}")

    worker = echomq.Worker(client, "raw", handler, poll_interval=0.02, max_attempts=5).start()
    try:
        assert wait_until(lambda: (i := client.job("raw", "j")) is not None and i.state == "dead", 20)
    finally:
        worker.stop()
    info = client.job("raw", "j")
    assert info is not None and info.tries == 1 and info.last_error == "NonRetryable: cannot take b'x'"
    assert info.traceback is not None and "in handler" in info.traceback
    assert "_call_handler" not in info.traceback  # the worker's own frames are left out


def test_results_expire_with_the_done_retention(client: echomq.Client) -> None:
    app = echomq.App(client, queue="brief")
    client.retention("brief", done_ms=300)

    @app.task
    def one() -> int:
        return 1

    handle = one.enqueue()
    with quick(app):
        assert handle.result(timeout=20) == 1
    assert wait_until(lambda: client.job("brief", handle.id) is None, 20)
    with pytest.raises(echomq.JobGone):
        handle.result(timeout=1)


def test_an_asyncio_result_over_the_ceiling_fails_the_job_and_nothing_is_stored(
    small: echomq.Client,  # noqa: F811 (the fixture)
) -> None:
    port = small.redis.connection_pool.connection_kwargs["port"]  # type: ignore[union-attr]

    async def main() -> None:
        client = emq.Client(redis.asyncio.Redis(port=port), script_limits=small._limits)
        app = emq.App(client, queue="q")

        @app.task(max_attempts=1)
        async def big() -> str:
            return "x" * SMALL

        handle = await big.enqueue()
        worker = app.worker(poll_interval=0.02, grace=0.5)
        running = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            with pytest.raises(echomq.JobFailed) as failed:
                await handle.result(timeout=20)
        finally:
            worker.stop()
            await running
        assert failed.value.type == "ResultTooLarge"
        info = await client.job("q", handle.id)
        assert info is not None and info.state == "dead" and info.result is None
        await client.aclose()

    asyncio.run(main())


def test_msgpack_carries_bytes_and_is_refused_by_a_json_reader(client: echomq.Client) -> None:
    pytest.importorskip("msgpack", reason="the msgpack extra (echomq[msgpack], in the test extras)")
    app = echomq.App(client, queue="packed", serializer=echomq.tasks.MSGPACK)

    @app.task
    def echo(blob: bytes, n: int) -> dict[str, object]:
        return {"blob": blob, "n": n}

    handle = echo.enqueue(b"\x00\xff", 3)
    info = client.job("packed", handle.id, payload=True)
    assert info is not None and info.payload is not None and info.payload.startswith(b"task echo msgpack\n")
    with quick(app):
        assert handle.result(timeout=20) == {"blob": b"\x00\xff", "n": 3}
    assert client.result("packed", handle.id, timeout=1, serializer=echomq.tasks.MSGPACK)["n"] == 3
    with pytest.raises(echomq.tasks.BadTaskPayload, match="'msgpack' form"):
        client.result("packed", handle.id, timeout=1)
    with pytest.raises(SerializationError, match="argument 1: msgpack cannot carry"):
        echo.enqueue(object(), 1)  # type: ignore[arg-type]


def test_a_cli_worker_on_a_queue_no_task_uses_warns(
    server: EmbeddedServer, backend: str, tasks_module: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env.update(PYTHONPATH=pythonpath(ROOT / "python", tasks_module), ECHOMQ_URL=server.url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "worker", "clitasks:app", "--queue", "cli-mial",
         "--backend", backend, "--grace", "0", "--no-metrics"],
        cwd=tasks_module, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        seen = ""
        while "worker of" not in seen:  # the warning comes before the worker's first line
            line = proc.stderr.readline()
            assert line, f"the worker exited: {seen}"
            seen += line
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert "--queue cli-mial: none of clitasks:app's tasks uses it (theirs: cli-mail, cli-other)" in seen


def test_a_task_call_is_a_unique_job_by_options_or_by_the_tasks_own_key(client: echomq.Client) -> None:
    app = echomq.App(client, queue="uniq")

    @app.task(unique="{user_id}")
    def welcome(user_id: int, lang: str = "en") -> str:
        return f"{user_id}:{lang}"

    @app.task
    def plain(x: int) -> int:
        return x

    first = welcome.enqueue(7)
    again = welcome.enqueue(7, lang="fr")  # the same key (the template names user_id only): held
    other = welcome.enqueue(8)
    assert first.created and not again.created and again.id == first.id and other.created
    swapped = welcome.options(replace=True).enqueue(7, lang="de")
    assert swapped.id == first.id and swapped.replaced and not swapped.created
    a = plain.options(unique_key="once").enqueue(1)
    b = plain.options(unique_key="once").enqueue(2)
    assert a.created and not b.created and b.id == a.id
    by_name = app.options(unique_key="once").enqueue("plain", 3)
    assert not by_name.created and by_name.id == a.id
    with pytest.raises(ValueError, match="need a unique key"):
        plain.options(replace=True).enqueue(1)
    with pytest.raises(ValueError, match=r"unique='\{nope\}' names no argument 'nope'"):
        app.task(name="bad", unique="{nope}")(lambda x: x).enqueue(1)
    with pytest.raises(ValueError, match="unique_for_ms needs unique="):
        app.task(name="bad2", unique_for_ms=1000)(lambda: None)
    assert client.counts("uniq").pending == 3  # welcome 7 and 8, plain once
    with quick(app):
        assert first.result(timeout=20) == "7:de"


def test_a_unique_task_enqueued_20_times_at_once_gives_one_job(client: echomq.Client) -> None:
    app = echomq.App(client, queue="uniq-race")

    @app.task(unique=lambda order: f"order-{order}", unique_for_ms=60_000)
    def ship(order: int) -> None: ...

    start = threading.Barrier(20)
    handles: list[Any] = []

    def go() -> None:
        start.wait()
        handles.append(ship.enqueue(42))

    threads = [threading.Thread(target=go) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(handles) == 20 and len({h.id for h in handles}) == 1
    assert sum(h.created for h in handles) == 1 and client.counts("uniq-race").pending == 1


def test_an_asyncio_task_call_is_a_unique_job(server: EmbeddedServer, backend: str) -> None:
    async def main() -> None:
        aclient = emq.Client(redis.asyncio.Redis(port=server.port), backend=backend)
        try:
            app = emq.App(aclient, queue="uniq-async")

            @app.task(unique="{k}")
            async def f(k: str) -> None: ...

            one, two = await f.enqueue("a"), await f.options(unique_key="f:a").enqueue("b")
            assert one.created and not two.created and two.id == one.id
        finally:
            await aclient.aclose()

    asyncio.run(main())


def test_echomq_call_enqueues_a_task_call_and_waits_for_its_result(
    server: EmbeddedServer, backend: str, tasks_module: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env.update(PYTHONPATH=pythonpath(ROOT / "python", tasks_module), ECHOMQ_URL=server.url)

    def call(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "echomq", "call", *argv, "--backend", backend],
            cwd=tasks_module, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    refused = call("add", "[2]", "--app", "clitasks:app")
    assert refused.returncode == 1 and "task 'add': missing a required argument: 'b'" in refused.stderr
    assert call("add", "{}").stderr.endswith(
        "ARGS_JSON must be a JSON array, e.g. '[2, 3]', not a JSON object\n"
    )
    nosuch = call("nope", "--app", "clitasks:app")
    assert nosuch.returncode == 1 and "clitasks:app has no task 'nope' (it has: add, leave)" in nosuch.stderr
    raw = subprocess.run(
        [sys.executable, "-m", "echomq", "enqueue", "cli-mail", "raw", "--backend", backend],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    proc = cli_worker(server, tasks_module, backend)
    try:
        done = call("add", "[20, 3]", "--app", "clitasks:app", "--wait", "30")
        assert done.returncode == 0 and done.stdout == "23\n", done.stderr
        by_queue = call("add", "[1]", "--kwargs", '{"b": 1}', "--queue", "cli-mail", "--wait", "30")
        assert by_queue.returncode == 0 and by_queue.stdout == "2\n", by_queue.stderr
        dead = subprocess.run(
            [sys.executable, "-m", "echomq", "result", "cli-mail", raw.stdout.strip(), "--wait", "30",
             "--backend", backend],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert dead.returncode == 1 and "NotATask: not a task job" in dead.stderr and "echomq call" in dead.stderr


def test_a_periodic_task_fires_each_tick_once_with_three_workers(
    client: echomq.Client, r: redis.Redis, server: EmbeddedServer, backend: str
) -> None:
    # Three workers (three apps, as three processes would have), one schedule, each tick one job.
    ran: list[tuple[str, int]] = []
    apps = [echomq.App(client, queue="beat") for _ in range(3)]
    for app in apps:

        @app.task(cron="* * * * * *", args=("ping",), kwargs={"n": 1})  # six fields: every second
        def beat(word: str, n: int = 0) -> None:
            ran.append((word, n))

    assert list(apps[0].periodic) == [("beat", "beat")]
    workers = [quick(app, reap_interval=0.1) for app in apps]
    for w in workers:
        w.start()
    try:
        assert wait_until(lambda: len(ran) >= 3, timeout=30)
    finally:
        for w in workers:
            w.stop()
    ids = sorted(k.decode().rsplit(":", 1)[-1] for k in r.scan_iter("emq:{beat}:job:*"))
    assert len(ids) == len(set(ids)) >= 3 and all(i.startswith("beat@") for i in ids)
    ticks = [int(i.split("@")[1]) for i in ids]
    assert all(t % 1000 == 0 for t in ticks)  # one job per second's tick, named by it
    assert ran.count(("ping", 1)) == len(ran) and len(ran) >= 3
    (info,) = client.schedules("beat")
    assert info.fired == len(ids) and info.schedule.cron == "* * * * * *"
    listed = subprocess.run(
        [sys.executable, "-m", "echomq", "schedule", "list", "beat", "--url", server.url,
         "--backend", backend],
        env={**os.environ, "PYTHONPATH": pythonpath(ROOT / "python")}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    row = listed.stdout.splitlines()[2].split()
    assert listed.returncode == 0 and row[:2] == ["beat", "beat"], listed.stdout  # NAME, TASK


def test_app_schedule_checks_its_call_and_timing_when_made(client: echomq.Client) -> None:
    app = echomq.App(client, queue="beat2")

    @app.task
    def report(day: str) -> None: ...

    with pytest.raises(TypeError, match="task 'report': missing a required argument: 'day'"):
        app.schedule(report, "daily", cron="0 8 * * *")
    with pytest.raises(ValueError, match="give exactly one of cron= and every_ms="):
        app.schedule(report, "daily", args=["mon"])
    with pytest.raises(ValueError, match="need cron= or every_ms="):
        app.task(name="x", tz="Europe/Berlin")(lambda: None)
    assert "x" not in app.tasks
    app.schedule("report", "daily", cron="0 8 * * *", tz="Europe/Berlin", args=["mon"])
    with pytest.raises(ValueError, match="already has a schedule 'daily'"):
        app.schedule(report, "daily", every_ms=1000, args=["tue"])
    assert client.schedules("beat2") == []  # stored when a worker starts, not before
    (stored,) = app.register_schedules()
    assert stored.name == "daily" and stored.schedule.tz == "Europe/Berlin"
    assert app.register_schedules()[0].last_ms == stored.last_ms  # again: the same schedule, its cursor kept


def test_an_apps_worker_waits_for_its_server_when_asked(server_factory: Any) -> None:
    probe = server_factory()
    port = probe.port
    probe.stop()
    client = echomq.Client.from_url(f"redis://127.0.0.1:{port}/0")
    app = echomq.App(client, queue="late-app")

    @app.task
    def hello() -> str:
        return "hi"

    with pytest.raises(ValueError, match="wait_for_server"):
        app.worker(wait_for_server=-1)
    worker = app.worker(poll_interval=0.02, grace=0.5, wait_for_server=60)
    starter = threading.Thread(target=worker.start)
    starter.start()
    time.sleep(0.5)
    assert starter.is_alive()  # still waiting: nothing answers yet
    server_factory(port=port)
    starter.join(60)
    try:
        assert hello.enqueue().result(timeout=30) == "hi"
    finally:
        worker.stop()

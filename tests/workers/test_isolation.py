"""isolation="process" (issue 30): handlers in child processes that a timeout kills and a crash spares.

Real child processes, real signals: each test reads what the handlers wrote
(their process ids) and what the server holds.  An app's tasks too (issue
42): the children import the app by name and dispatch by task name, and a
task that ignores its token is killed at its timeout (the hard stop).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.isolation import ChildCrashed, ProcessPool
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from .. import isolation_handlers as h
from .. import isolation_tasks as t
from ..faults import pythonpath, wait_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.once

Q = "isolated"
K = queue_keys(Q)


def row(r: redis.Redis, job_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(K.job(job_id)).items()}


def lines(path: Path) -> list[list[str]]:
    return [line.split(" ", 2) for line in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by its parent) counts as gone; so does one
    # reaped between the signal and the read (its /proc entry is gone).
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.backends
def test_a_handler_that_ignores_its_token_is_killed_at_the_timeouts_end(
    r: redis.Redis, client: echomq.Client, tmp_path: Path
) -> None:
    # A thread cannot be stopped (tests/workers/test_worker_timeouts.py); a child can: past the timeout
    # and its grace the child is killed, the job failed with the timeout's error, and the
    # worker's one slot runs the next job in a fresh child.
    out = tmp_path / "out"
    client.enqueue(Q, str(out).encode(), job_id="deaf")
    worker = echomq.Worker(
        client, Q, h.deaf_once, isolation="process", timeout_ms=300, timeout_grace=0.3, max_attempts=1,
        reap=False,
    )  # fmt: skip
    with worker:
        assert wait_until(lambda: row(r, "deaf").get("state") == "dead", timeout=30)
        ((_, pid, _),) = lines(out)
        assert wait_until(lambda: not alive(int(pid)), timeout=10), "the child was not killed"
        client.enqueue(Q, str(out).encode(), job_id="next")
        assert wait_until(lambda: row(r, "next").get("state") == "done", timeout=30)
    assert row(r, "deaf")["last_error"] == "TimeoutError: the handler ran longer than its timeout (300 ms)"
    assert worker.stats.abandoned == 1 and worker.stats.completed == 1
    (_, next_pid, _) = lines(out)[1]
    assert next_pid != pid and next_pid != str(os.getpid())
    assert r.zcard(K.active) == 0


@pytest.mark.backends
def test_a_child_that_dies_fails_its_job_a_try_used_and_the_worker_goes_on(
    r: redis.Redis, client: echomq.Client, tmp_path: Path
) -> None:
    # os._exit in a handler (a segfault, the OOM killer alike) would end a thread worker's
    # process; here it is the job's failure, and after its tries the job is dead, not looping.
    out = tmp_path / "out"
    client.enqueue(Q, str(out).encode(), job_id="crash")
    worker = echomq.Worker(client, Q, h.crash, isolation="process", max_attempts=2, reap=False)
    with worker:
        assert wait_until(lambda: row(r, "crash").get("state") == "dead", timeout=30)
    info = row(r, "crash")
    assert info["last_error"] == (
        "ChildCrashed: the handler's process died before it returned (exited with status 3)"
    )
    assert len(lines(out)) == 2 and worker.stats.failed == 2
    assert len({pid for _, pid, _ in lines(out)}) == 2  # each attempt in a new child


def test_a_child_that_exits_leaving_a_grandchild_holding_its_pipe_is_seen_to_have_died(
    r: redis.Redis, client: echomq.Client, tmp_path: Path
) -> None:
    # The worker read the child's end from its pipe only: a child that exits
    # leaving a process of its own with the pipe open was never seen to end
    # (without timeout_ms its job was held for ever; with one it was called a
    # timeout).  Its end is the process's own now.
    out = tmp_path / "out"
    client.enqueue(Q, str(out).encode(), job_id="orphaning")
    worker = echomq.Worker(
        client, Q, h.crash_leaving_a_grandchild, isolation="process", max_attempts=1, reap=False
    )
    started = time.monotonic()
    with worker:
        assert wait_until(lambda: row(r, "orphaning").get("state") == "dead", timeout=15)
    assert time.monotonic() - started < 10  # not the grandchild's 30 s
    info = row(r, "orphaning")
    assert info["last_error"] == (
        "ChildCrashed: the handler's process died before it returned (exited with status 4)"
    )
    assert lines(out) and worker.stats.failed == 1 and worker.stats.timed_out == 0


def test_handler_exceptions_cross_back_as_they_were(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, b"", job_id="plain")
    with echomq.Worker(client, Q, h.fails, isolation="process", max_attempts=1, reap=False):
        assert wait_until(lambda: row(r, "plain").get("state") == "dead", timeout=30)
    assert row(r, "plain")["last_error"] == "ValueError: bad row in plain"
    # An exception that will not unpickle is named, not lost.
    client.enqueue(Q, b"", job_id="odd")
    with echomq.Worker(client, Q, h.fails_oddly, isolation="process", max_attempts=1, reap=False):
        assert wait_until(lambda: row(r, "odd").get("state") == "dead", timeout=30)
    assert row(r, "odd")["last_error"] == "ChildError: Unpicklable: code 7"


def test_checkpoints_from_the_child_are_stored_and_fenced_by_the_worker(
    r: redis.Redis, client: echomq.Client, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    client.enqueue(Q, str(out).encode(), job_id="resume")
    retry = echomq.RetryPolicy.fixed(10, max_attempts=2)
    with echomq.Worker(client, Q, h.resumes, isolation="process", retry=retry, reap=False):
        assert wait_until(lambda: row(r, "resume").get("state") == "done", timeout=30)
    assert [line[2] for line in lines(out)] == ["resume=None", "resume=b'half-way'"]
    # A state over the ceiling is refused in the handler (BadArgument, a ValueError), as in a thread.
    client.enqueue(Q, str(out).encode(), job_id="big")
    with echomq.Worker(client, Q, h.big_state, isolation="process", reap=False):
        assert wait_until(lambda: row(r, "big").get("state") == "done", timeout=30)
    assert lines(out)[-1][2] == "refused BadArgument"


def test_a_remote_cancel_and_the_shutdown_reach_the_childs_token(
    r: redis.Redis, client: echomq.Client, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    client.enqueue(Q, str(out).encode(), job_id="c")
    with echomq.Worker(client, Q, h.until_cancelled, isolation="process", reap=False):
        assert wait_until(lambda: len(lines(out)) == 1, timeout=30)
        client.cancel(Q, "c")
        assert wait_until(lambda: row(r, "c").get("state") == "cancelled", timeout=10)
    # The shutdown's grace ends: "shutdown" reaches the child, the job is given back, no try used.
    client.enqueue(Q, str(out).encode(), job_id="s")
    worker = echomq.Worker(client, Q, h.until_cancelled, isolation="process", grace=0.2, reap=False)
    worker.start()
    assert wait_until(lambda: len(lines(out)) == 2, timeout=30)
    worker.stop()
    info = row(r, "s")
    assert info["state"] == "pending" and info.get("tries", "0") == "0", info
    assert worker.stats.released == 1
    pids = {int(pid) for _, pid, _ in lines(out)}
    assert wait_until(lambda: not any(alive(p) for p in pids), timeout=10)  # the pool closed


def test_children_are_recycled_after_max_jobs_per_child(
    r: redis.Redis, client: echomq.Client, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    client.enqueue_many(Q, [str(out).encode()] * 5)
    with echomq.Worker(client, Q, h.quick, isolation="process", max_jobs_per_child=2, reap=False):
        assert wait_until(lambda: len(lines(out)) == 5, timeout=60)
    pids = [pid for _, pid, _ in lines(out)]
    assert [pids.count(p) for p in dict.fromkeys(pids)] == [2, 2, 1]


def test_a_sigterm_to_the_process_group_leaves_the_child_to_the_worker(tmp_path: Path) -> None:
    # Ctrl-C or a process group's SIGTERM reaches the children too: they ignore it, the
    # worker's stop tells them through their tokens.
    pool = ProcessPool(h.until_cancelled)
    out = tmp_path / "out"
    token = echomq.CancelToken()
    job = echomq.Job(Q, "g", "1-aa", str(out).encode())
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        try:
            pool.call(job, token, None, True)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert wait_until(lambda: len(lines(out)) == 1, timeout=30)
        pid = int(lines(out)[0][1])
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
        t.join(0.5)
        assert t.is_alive() and alive(pid)
        token.cancel("shutdown")
        t.join(10)
        assert [type(e).__name__ for e in errors] == ["Cancelled"] and str(errors[0]) == "cancelled: shutdown"
        # A child killed under a running handler is ChildCrashed, naming the signal.
        errors.clear()
        token2 = echomq.CancelToken()
        t = threading.Thread(target=lambda: errors.append(_call(pool, job, token2)))
        t.start()
        assert wait_until(lambda: len(lines(out)) == 2, timeout=30)
        os.kill(int(lines(out)[1][1]), signal.SIGKILL)
        t.join(10)
        assert isinstance(errors[0], ChildCrashed) and "killed by SIGKILL" in str(errors[0])
    finally:
        pool.close()


def _call(pool: ProcessPool, job: echomq.Job, token: echomq.CancelToken) -> BaseException | None:
    try:
        pool.call(job, token, None, True)
    except BaseException as exc:
        return exc
    return None


def test_isolation_settings_are_checked(client: echomq.Client) -> None:
    with pytest.raises(TypeError, match="importable by name"):
        echomq.Worker(client, Q, lambda ctx: None, isolation="process")
    with pytest.raises(ValueError, match="isolation must be one of 'thread', 'process', got 'fork'"):
        echomq.Worker(client, Q, h.quick, isolation="fork")
    with pytest.raises(ValueError, match="max_jobs_per_child needs isolation='process'"):
        echomq.Worker(client, Q, h.quick, max_jobs_per_child=5)
    with pytest.raises(ValueError, match="max_jobs_per_child must be between 1"):
        echomq.Worker(client, Q, h.quick, isolation="process", max_jobs_per_child=0)


def test_the_asyncio_worker_runs_an_importable_handler_in_a_child_that_its_timeout_kills(
    server: EmbeddedServer, backend: str, r: redis.Redis, tmp_path: Path
) -> None:
    # echomq.asyncio.Worker(isolation="process"): the child runs the async handler in a loop of
    # its own; one that blocks that loop is killed at the abandon, and the next job gets a new child.
    async def local(ctx: emq.JobContext) -> None: ...

    with pytest.raises(TypeError, match="importable by name"):
        emq.Worker(emq.Client(redis.asyncio.Redis()), Q, local, isolation="process")
    out = tmp_path / "out"

    async def main() -> emq.Worker:
        client = emq.Client(redis.asyncio.Redis(port=server.port), backend=backend)
        try:
            await client.enqueue(Q, str(out).encode(), job_id="deaf")
            await client.enqueue(Q, str(out).encode(), job_id="next")
            worker = emq.Worker(
                client, Q, h.deaf_once_async, isolation="process", timeout_ms=300, timeout_grace=0,
                max_attempts=1, poll_interval=0.02, reap=False,
            )  # fmt: skip
            async with worker:
                while worker.stats.completed + worker.stats.abandoned < 2:
                    await asyncio.sleep(0.02)
            return worker
        finally:
            await client.aclose()

    worker = asyncio.run(main())
    assert worker.stats.abandoned == 1 and worker.stats.completed == 1
    assert row(r, "deaf")["last_error"] == "TimeoutError: the handler ran longer than its timeout (300 ms)"
    assert row(r, "next")["state"] == "done"
    started = [pid for job, pid, what in lines(out) if job == "deaf"]
    ran = [pid for job, pid, what in lines(out) if job == "next" and what == "ran"]
    assert ran and started and ran[0] != started[0] and str(os.getpid()) not in (*ran, *started)
    assert wait_until(lambda: not alive(int(started[0])), timeout=10), "the child was not killed"


def test_a_script_without_a_main_guard_starts_its_children_once(tmp_path: Path) -> None:
    # multiprocessing's spawn re-runs the parent's __main__ in every child: an unguarded
    # script would start its worker again in each. The children run the package only.
    (tmp_path / "tasks_mod.py").write_text("def handler(ctx):\n    print('ran', ctx.id, flush=True)\n")
    (tmp_path / "script.py").write_text(
        "import echomq\n"
        "from echomq.testing import EmbeddedServer\n"
        "from tasks_mod import handler\n"
        "print('script started', flush=True)\n"
        "with EmbeddedServer() as server:\n"
        "    client = echomq.Client(server.client())\n"
        "    client.enqueue('s', b'', job_id='one')\n"
        "    with echomq.Worker(client, 's', handler, isolation='process', concurrency=2) as w:\n"
        "        while w.stats.completed < 1:\n"
        "            pass\n"
    )
    done = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["script started", "ran one"]


# -- an app's tasks in child processes (issue 42): the hard stop ---------------------------------


@pytest.fixture
def app(client: echomq.Client) -> echomq.App:
    # The module's app, on this test's server (its children import it and never use its client).
    t.app.client = client
    return t.app


def notes(path: Path) -> list[tuple[str, int]]:
    """What a task of tests/isolation_tasks.py wrote: (what, pid) per line."""
    found = [line.rsplit(" ", 1) for line in path.read_text().splitlines()] if path.exists() else []
    return [(what, int(pid)) for what, pid in found]


def test_the_hard_stop_a_task_that_ignores_its_token_is_killed_at_its_timeout(
    app: echomq.App, client: echomq.Client, tmp_path: Path
) -> None:
    # stubborn sleeps 1.5 s in a loop without a checkpoint (as a C call that does not return would),
    # then writes "after".  Its worker's children import the app by name and dispatch by task name;
    # at the timeout the child is killed: the job is dead, and "after" is never written.
    out = tmp_path / "out"
    stuck = t.stubborn.enqueue(str(out))
    worker = app.worker(
        isolation="process", timeout_ms=300, timeout_grace=0, max_attempts=1, poll_interval=0.02, reap=False
    )
    with worker:
        with pytest.raises(echomq.JobFailed) as failed:
            stuck.result(timeout=30)
        assert failed.value.type == "TimeoutError", failed.value
        ((what, pid),) = notes(out)
        assert what == "started" and pid != os.getpid()
        assert wait_until(lambda: not alive(pid), timeout=10), "the child was not killed"
        after = t.add.enqueue(2, 3)  # the slot goes on, in a fresh child
        assert after.result(timeout=30)["sum"] == 5
    time.sleep(2.0)  # longer than the loop had left: a thread would have written "after" by now
    assert notes(out) == [("started", pid)]
    assert worker.workers[0].stats.abandoned == 1


def test_with_threads_a_timed_out_tasks_thread_runs_on(
    app: echomq.App, client: echomq.Client, tmp_path: Path
) -> None:
    # What the hard stop is for: the same task in a thread has its job failed at the timeout,
    # but the thread cannot be stopped and its side effect happens anyway.
    out = tmp_path / "out"
    stuck = t.stubborn.enqueue(str(out))
    with app.worker(timeout_ms=300, timeout_grace=0, max_attempts=1, poll_interval=0.02, reap=False):
        with pytest.raises(echomq.JobFailed):
            stuck.result(timeout=30)
        assert wait_until(lambda: len(notes(out)) == 2, timeout=10)
    assert notes(out) == [("started", os.getpid()), ("after", os.getpid())]


def test_a_task_that_asks_for_a_process_is_killed_in_a_worker_of_threads(
    app: echomq.App, client: echomq.Client, tmp_path: Path
) -> None:
    # @app.task(isolation="process", timeout_ms=300): its jobs run in children of the dispatcher's
    # own, the others in the worker's threads; max_jobs_per_child recycles the task's children.
    out = tmp_path / "out"
    stuck = t.stubborn_alone.enqueue(str(out))
    worker = app.worker(timeout_grace=0, poll_interval=0.02, reap=False)
    with worker:
        with pytest.raises(echomq.JobFailed) as failed:
            stuck.result(timeout=30)
        assert failed.value.message == "the handler ran longer than its timeout (300 ms)"
        ((_, pid),) = notes(out)
        assert pid != os.getpid()
        assert wait_until(lambda: not alive(pid), timeout=10), "the task's child was not killed"
        assert t.here.enqueue().result(timeout=30) == os.getpid()  # a task of the worker's: a thread
        whose = [t.whose.enqueue().result(timeout=30) for _ in range(5)]
    time.sleep(2.0)
    assert notes(out) == [("started", pid)]
    assert os.getpid() not in whose and [whose.count(p) for p in dict.fromkeys(whose)] == [2, 2, 1]
    assert not any(alive(p) for p in whose)  # the worker's stop closed the task's children


def test_a_tasks_own_max_jobs_per_child_recycles_the_children_of_a_worker_in_processes(
    app: echomq.App, client: echomq.Client
) -> None:
    # Issue 42: @app.task(isolation="process", max_jobs_per_child=2) in a worker whose children run
    # every task: its jobs recycle those children as they do the task's own in a worker of threads.
    # Before, only the worker's own max_jobs_per_child counted: one child ran all five.
    with app.worker(isolation="process", concurrency=1, poll_interval=0.02, reap=False):
        whose = [t.whose.enqueue().result(timeout=30) for _ in range(5)]
        here = [t.here.enqueue().result(timeout=30) for _ in range(3)]  # no limit of its own
    assert os.getpid() not in whose and [whose.count(p) for p in dict.fromkeys(whose)] == [2, 2, 1]
    assert len(set(here)) == 1 and here[0] == whose[-1]  # the last child goes on: 1 of its 2 used
    assert not any(alive(p) for p in whose)


def test_what_crosses_the_pipe_for_an_apps_task(
    app: echomq.App, client: echomq.Client, r: redis.Redis, tmp_path: Path
) -> None:
    # Results, tracebacks, NonRetryable, RetryLater (its delay), RateLimited, progress and
    # checkpoints, cancels.
    out = tmp_path / "out"
    added = t.add.enqueue(2, 3)
    failing = t.fails.enqueue(7)
    refused = t.refuses.enqueue()
    later = t.later.enqueue(str(out / "later"))
    reported = t.reports.enqueue(str(out / "reports"))
    throttled = t.throttled.enqueue(str(out / "throttled"))
    out.mkdir()
    with app.worker(isolation="process", max_attempts=3, poll_interval=0.02, reap=False):
        result = added.result(timeout=30)
        assert result["sum"] == 5 and result["pid"] != os.getpid()
        with pytest.raises(echomq.JobFailed) as failed:
            failing.result(timeout=30)
        # The child's traceback, from the task's own frame, as a thread would store it.
        trace = failed.value.traceback or ""
        assert trace.startswith("Traceback") and 'raise ValueError(f"bad row {row}")' in trace
        assert "isolation_tasks.py" in trace and "echomq/isolation.py" not in trace, trace
        assert failed.value.type == "ValueError" and failed.value.message == "bad row 7"
        with pytest.raises(echomq.JobFailed) as dead:
            refused.result(timeout=30)
        assert dead.value.type == "NonRetryable"
        assert later.result(timeout=30) == "done"
        assert reported.result(timeout=30) != os.getpid()
        assert throttled.result(timeout=30) == "done"
        cancelled = t.until_cancelled.enqueue(str(out / "cancel"))
        assert wait_until(lambda: (out / "cancel").exists(), timeout=30)
        client.cancel(t.Q, cancelled.id)
        with pytest.raises(echomq.JobCancelled):
            cancelled.result(timeout=30)
    info = client.job(t.Q, failing.id)
    assert info is not None and info.tries == 3  # an ordinary failure: retried
    info = client.job(t.Q, refused.id)
    assert info is not None and info.tries == 1 and info.state == "dead"
    info = client.job(t.Q, later.id)
    assert info is not None and info.last_error == "RetryLater: busy" and info.tries == 2
    (first, _), (second, _) = notes(out / "later")
    assert float(second.split()[1]) - float(first.split()[1]) >= 0.2  # its delay_ms crossed too
    info = client.job(t.Q, throttled.id)  # RateLimited crossed: given back, no try used
    assert info is not None and info.tries == 1 and len(notes(out / "throttled")) == 2, info
    info = client.job(t.Q, reported.id)
    assert info is not None and info.progress == b'{"done":3,"of":4}'
    assert [what for what, _ in notes(out / "reports")] == [f"reported {reported.id}"]


@pytest.mark.parametrize(
    ("target", "queue", "add", "stubborn", "settings", "settle"),
    [
        ("app", t.Q, "add", "stubborn", ["--timeout-ms", "300", "--max-attempts", "1"], 2.0),
        ("aio_whole", t.WQ, "add_whole", "stubborn_whole", [], 1.6),  # the asyncio App
    ],
)
def test_echomq_worker_runs_an_app_in_process_isolation(
    server: EmbeddedServer,
    client: echomq.Client,
    tmp_path: Path,
    target: str,
    queue: str,
    add: str,
    stubborn: str,
    settings: list[str],
    settle: float,
) -> None:
    # The CLI names the app (MODULE:APP): the children import it by that path, an echomq.App's or
    # an echomq.asyncio.App's; the task that ignores its token is killed at its timeout.
    out = tmp_path / "out"
    producer = echomq.App(client, queue=queue)  # by name: this process needs no task of its own
    added = producer.enqueue(add, 2, 3)
    stuck = producer.enqueue(stubborn, str(out))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env.update(PYTHONPATH=pythonpath(ROOT / "python", ROOT), ECHOMQ_URL=server.url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "worker", f"tests.isolation_tasks:{target}", "--isolation",
         "process", *settings, "--timeout-grace", "0", "--grace", "0", "--poll-interval", "0.05",
         "--no-metrics", "--no-reap"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        result = added.result(timeout=60)
        with pytest.raises(echomq.JobFailed) as failed:
            stuck.result(timeout=60)
        time.sleep(settle)  # longer than the task had left: it would have written "after"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert result["sum"] == 5 and result["pid"] not in (proc.pid, os.getpid())
    assert failed.value.type == "TimeoutError"
    assert [what for what, _ in notes(out)] == ["started"]


def test_process_isolation_for_an_app_is_checked_where_it_is_asked_for(client: echomq.Client) -> None:
    made_here = echomq.App(client, queue="iso-here")

    @made_here.task
    def nothing() -> None: ...

    where = r"no global of 'tests\.workers\.test_isolation' holds this one.*import_path="
    with pytest.raises(TypeError, match=where):
        made_here.worker(isolation="process")
    made_here.worker()  # threads: nothing to import
    aio_here = emq.App(emq.Client(redis.asyncio.Redis()), queue="iso-here")
    aio_here.task(name="nothing")(lambda: None)
    with pytest.raises(TypeError, match=where):  # the asyncio app's twin, said before a worker is made
        aio_here.worker(isolation="process")
    named = echomq.App(client, queue="iso-here", import_path="tests.isolation_tasks:app")
    assert named.import_path == "tests.isolation_tasks:app"
    with pytest.raises(ValueError, match="import_path must be MODULE:ATTR"):
        echomq.App(client, import_path="tests.isolation_tasks")
    with pytest.raises(ValueError, match="isolation must be 'process'"):
        named.task(isolation="thread")(lambda: None)
    with pytest.raises(ValueError, match="max_jobs_per_child needs isolation='process'"):
        named.task(max_jobs_per_child=3)(lambda: None)
    with pytest.raises(ValueError, match="isolation must be 'process'"):
        emq.App(emq.Client(redis.asyncio.Redis())).task(isolation="fork")(lambda: None)

    # A path the children cannot import: said as the worker starts, before anything is claimed.
    @named.task(isolation="process")
    def elsewhere() -> None: ...

    with pytest.raises(ChildCrashed, match=r"could not start .*LookupError: .*no task 'elsewhere'"):
        named.worker(queues=["iso-here"], poll_interval=0.02).start()
    # The module's app is found where it was made: its children import it from there.
    assert isolation_path(t.app) == "tests.isolation_tasks:app"


def isolation_path(app: echomq.App) -> str:
    from echomq.tasks.isolated import import_path_of

    return import_path_of(app)


def test_an_asyncio_apps_task_that_asks_for_a_process_is_killed_at_its_timeout(
    server: EmbeddedServer, backend: str, r: redis.Redis, tmp_path: Path
) -> None:
    # The asyncio worker cancels a task at its next await; one that blocks its loop has none.
    # Asking for a process, it runs in a child (an asyncio context there, its calls awaited
    # over the pipe), killed at the abandon like a thread worker's.
    out = tmp_path / "out"

    async def main() -> None:
        client = emq.Client(redis.asyncio.Redis(port=server.port), backend=backend)
        t.aio_app.client = client
        try:
            stuck = await t.stubborn_async.enqueue(str(out))
            reported = await t.reports_async.enqueue(str(tmp_path / "reports"))
            here = await t.here_async.enqueue()
            worker = t.aio_app.worker(timeout_grace=0, poll_interval=0.02, reap=False)
            running = asyncio.ensure_future(worker.run(handle_signals=False))
            try:
                with pytest.raises(echomq.JobFailed) as failed:
                    await stuck.result(timeout=30)
                assert failed.value.type == "TimeoutError"
                assert await reported.result(timeout=30) != os.getpid()
                assert await here.result(timeout=30) == os.getpid()
                info = await reported.info()
                assert info is not None and info.progress == b'{"done":1}'
            finally:
                worker.stop()
                await running
        finally:
            await client.aclose()

    asyncio.run(main())
    ((what, pid),) = notes(out)
    assert what == "started" and pid != os.getpid()
    assert wait_until(lambda: not alive(pid), timeout=10), "the task's child was not killed"
    time.sleep(2.0)
    assert notes(out) == [("started", pid)]


# -- an asyncio app's worker in process isolation: every task in its children ---------------------


def run_whole(server: EmbeddedServer, backend: str, body: Any, **settings: Any) -> None:
    """``body(worker)`` beside ``t.aio_whole.worker(isolation="process", **settings)``, on this server."""

    async def main() -> None:
        client = emq.Client(redis.asyncio.Redis(port=server.port), backend=backend)
        t.aio_whole.client = client
        try:
            worker = t.aio_whole.worker(isolation="process", poll_interval=0.02, reap=False, **settings)
            running = asyncio.ensure_future(worker.run(handle_signals=False))
            try:
                await body(client, worker)
            finally:
                worker.stop()
                await running
        finally:
            await client.aclose()

    asyncio.run(main())


def test_an_asyncio_apps_worker_in_process_isolation_kills_a_task_at_its_timeout(
    server: EmbeddedServer, backend: str, tmp_path: Path
) -> None:
    # echomq.asyncio.Worker(isolation="process") for an app: the children import it by name and run
    # every task, async or plain; one that blocks its child's loop is killed at its abandon, and
    # the worker's max_jobs_per_child recycles the children.
    out = tmp_path / "out"
    seen: dict[str, Any] = {}

    async def body(client: emq.Client, worker: Any) -> None:
        stuck = await t.stubborn_whole.enqueue(str(out))
        with pytest.raises(echomq.JobFailed) as failed:
            await stuck.result(timeout=30)
        seen["failed"] = failed.value
        seen["pids"] = [(await (await t.plain_whole.enqueue()).result(timeout=30)) for _ in range(3)]
        seen["abandoned"] = worker.workers[0].stats.abandoned

    run_whole(server, backend, body, timeout_grace=0, max_jobs_per_child=2)
    assert seen["failed"].message == "the handler ran longer than its timeout (300 ms)"
    ((what, pid),) = notes(out)
    assert what == "started" and pid != os.getpid()
    assert wait_until(lambda: not alive(pid), timeout=10), "the child was not killed"
    pids = seen["pids"]
    assert os.getpid() not in pids and pid not in pids
    assert [pids.count(p) for p in dict.fromkeys(pids)] == [2, 1]  # a child runs 2 jobs, then is replaced
    assert not any(alive(p) for p in pids)  # the worker's stop closed its children
    assert seen["abandoned"] == 1
    time.sleep(1.6)  # longer than the loop had left: a thread would have written "after" by now
    assert notes(out) == [("started", pid)]


def test_an_asyncio_workers_children_run_together_past_the_loops_default_executor(
    server: EmbeddedServer, backend: str, tmp_path: Path
) -> None:
    # Each slot waits on its child in a thread of its own: the loop's default executor (a few
    # threads: cores + 4, one here) would have the slots take turns, their timeouts running.
    out = tmp_path / "out"
    seen: list[int] = []

    async def body(client: emq.Client, worker: Any) -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        handles = [await t.meet_whole.enqueue(str(out), 2) for _ in range(2)]
        seen.extend([await h.result(timeout=30) for h in handles])

    run_whole(server, backend, body, concurrency=2)
    assert seen == [2, 2]


def test_what_crosses_the_pipe_for_an_asyncio_apps_task(
    server: EmbeddedServer, backend: str, r: redis.Redis, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    seen: dict[str, Any] = {}

    async def body(client: emq.Client, worker: Any) -> None:
        added = await t.add_whole.enqueue(2, 3)
        failing = await t.fails_whole.enqueue(7)
        refused = await t.refuses_whole.enqueue()
        later = await t.later_whole.enqueue(str(out / "later"))
        reported = await t.reports_whole.enqueue(str(out / "reports"))
        seen["added"] = await added.result(timeout=30)
        with pytest.raises(echomq.JobFailed) as failed:
            await failing.result(timeout=30)
        seen["failed"] = failed.value
        with pytest.raises(echomq.JobFailed) as dead:
            await refused.result(timeout=30)
        seen["dead"] = dead.value
        seen["later"] = await later.result(timeout=30)
        seen["reported"] = await reported.result(timeout=30)
        cancelled = await t.until_cancelled_whole.enqueue(str(out / "cancel"))
        assert await asyncio.to_thread(wait_until, lambda: (out / "cancel").exists(), timeout=30)
        await client.cancel(t.WQ, cancelled.id)
        with pytest.raises(echomq.JobCancelled):
            await cancelled.result(timeout=30)
        handles = {"failing": failing, "refused": refused, "later": later, "reported": reported}
        for name, handle in handles.items():
            seen[f"{name} info"] = await handle.info()
        seen["reported id"] = reported.id
        # The shutdown's grace ends as this body returns: "shutdown" reaches the child's token.
        stays = await t.until_cancelled_whole.enqueue(str(out / "stays"))
        assert await asyncio.to_thread(wait_until, lambda: (out / "stays").exists(), timeout=30)
        seen["stays"], seen["worker"] = stays.id, worker.workers[0]

    run_whole(server, backend, body, max_attempts=3, grace=0.2)
    stays = {k.decode(): v.decode() for k, v in r.hgetall(queue_keys(t.WQ).job(seen["stays"])).items()}
    assert stays["state"] == "pending" and stays.get("tries", "0") == "0", stays  # given back, no try used
    assert seen["worker"].stats.released == 1
    assert seen["added"]["sum"] == 5 and seen["added"]["pid"] != os.getpid()
    trace = seen["failed"].traceback or ""
    assert trace.startswith("Traceback") and 'raise ValueError(f"bad row {row}")' in trace
    assert "isolation_tasks.py" in trace and "echomq/isolation.py" not in trace, trace
    assert seen["failed"].type == "ValueError" and seen["failed"].message == "bad row 7"
    assert seen["failing info"].tries == 3  # an ordinary failure: retried
    assert seen["dead"].type == "NonRetryable"
    assert seen["refused info"].tries == 1 and seen["refused info"].state == "dead"
    assert seen["later"] == "done"
    assert seen["later info"].last_error == "RetryLater: busy" and seen["later info"].tries == 2
    (first, _), (second, _) = notes(out / "later")
    assert float(second.split()[1]) - float(first.split()[1]) >= 0.2  # RetryLater's delay_ms crossed
    assert seen["reported"] != os.getpid()
    assert seen["reported info"].progress == b'{"done":2,"of":4}'
    assert [what for what, _ in notes(out / "reports")] == [f"reported {seen['reported id']}"]

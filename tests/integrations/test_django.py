"""echomq.contrib.django: a Django project (tests/django_project, SQLite) whose django.tasks run on echomq.

The test process enqueues with Django's API (``task.enqueue``, ``get_result``);
``manage.py echomq_worker`` runs in a process of its own, against the suite's
server and the same SQLite file.  Django 6.0's ``django.tasks`` where it is
installed, else the ``django-tasks`` backport (Django 5.2 on Python 3.11).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import echomq
from echomq.testing import EmbeddedServer

pytestmark = pytest.mark.once

django = pytest.importorskip("django", reason="Django is a test extra (pip install -e .[test])")
try:
    import django.tasks as dtasks  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    dtasks = pytest.importorskip("django_tasks", reason="django-tasks (the backport) is a test extra")

PROJECT = Path(__file__).resolve().parent.parent / "django_project"


@pytest.fixture(scope="module")
def project(server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Django set up in this process on the project's settings, its tables made; the environment."""
    db = tmp_path_factory.mktemp("django") / "db.sqlite3"
    env = {"ECHOMQ_URL": server.url, "ECHOMQ_DJANGO_DB": str(db)}
    env["DJANGO_SETTINGS_MODULE"] = "project.settings"
    os.environ.update(env)
    sys.path.insert(0, str(PROJECT))
    from django.conf import settings

    if settings.configured and settings.DATABASES["default"]["NAME"] != str(db):
        pytest.skip("Django was set up by another test file in this process")
    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)
    yield env
    sys.path.remove(str(PROJECT))  # Django stays set up in this process; the rest is put back
    for key in env:
        os.environ.pop(key, None)


@pytest.fixture(scope="module")
def worker(project: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """``manage.py echomq_worker`` in a process of its own (stopped by SIGTERM, as a supervisor does)."""
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "echomq_worker", "--max-attempts", "3", "--concurrency", "2"],
        cwd=PROJECT, env={**os.environ, **project, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "echomq worker for default, mail" in first, first
    yield proc
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "worker of 'mail' stopped" in out


def finished(result: Any, seconds: float = 20) -> Any:
    deadline = time.monotonic() + seconds
    while not result.is_finished:
        assert time.monotonic() < deadline, f"{result.id} still {result.status}"
        time.sleep(0.05)
        result.refresh()
    return result


def admin(server: EmbeddedServer) -> echomq.Client:
    return echomq.Client(server.client())


def admin_of(project: dict[str, str]) -> echomq.Client:
    return echomq.Client.from_url(project["ECHOMQ_URL"])


def test_a_sync_task_reads_and_writes_the_database_in_the_worker(
    server: EmbeddedServer, project: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    from shop.models import Order
    from shop.tasks import send_receipt

    order = Order.objects.create(name="ada")
    result = send_receipt.enqueue(order.pk)
    assert result.status == dtasks.TaskResultStatus.READY and result.backend == "default"
    info = admin(server).job("mail", result.id)
    assert info is not None and info.priority == -10  # Django's 10 (more urgent) is echomq's -10
    done = finished(result)
    assert done.status == dtasks.TaskResultStatus.SUCCESSFUL
    assert done.return_value == "receipt for ada" and done.attempts == 1 and done.errors == []
    assert done.args == [order.pk] and done.finished_at is not None
    order.refresh_from_db()
    assert order.receipt_sent


def test_an_async_task_runs_and_get_result_finds_it_by_id(
    server: EmbeddedServer, project: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    from shop.tasks import add

    result = add.enqueue(2, 40)
    finished(result)
    again = add.get_result(result.id)  # a fresh read, as another process would
    assert again.status == dtasks.TaskResultStatus.SUCCESSFUL and again.return_value == 42
    with pytest.raises(dtasks.exceptions.TaskResultDoesNotExist):
        add.get_result("no-such-job")


def test_failures_are_retried_then_failed_with_their_class_and_traceback(
    server: EmbeddedServer, project: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    from shop.tasks import flaky, out_of_stock

    retried = finished(flaky.enqueue("m"))
    assert retried.status == dtasks.TaskResultStatus.SUCCESSFUL
    assert retried.return_value == {"attempt": 2, "id": retried.id, "marker": "m"}  # the TaskContext's
    failed = finished(out_of_stock.enqueue("sku-1"))
    assert failed.status == dtasks.TaskResultStatus.FAILED and failed.attempts == 3
    (error,) = failed.errors
    assert error.exception_class is LookupError and error.exception_class_path == "builtins.LookupError"
    assert "no stock of sku-1" in error.traceback and "out_of_stock" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        failed.return_value  # noqa: B018 (Django's rule: a failed task's value raises)


def test_run_after_delays_the_job(
    server: EmbeddedServer, project: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    from shop.tasks import add

    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    result = add.using(run_after=later).enqueue(1, 1)
    info = admin(server).job("default", result.id)
    assert info is not None and info.state == "pending" and info.due_at is not None
    assert abs(info.due_at / 1000 - later.timestamp()) < 1  # in <base>delayed until then
    time.sleep(0.3)  # the worker polls meanwhile: the job is not due
    info = admin(server).job("default", result.id)
    assert info is not None and info.attempts == 0
    assert add.get_result(result.id).status == dtasks.TaskResultStatus.READY
    admin(server).cancel("default", result.id)


def test_due_tasks_of_one_priority_are_claimed_in_run_after_order(project: dict[str, str]) -> None:
    # Issue 43, cause 5: Django's database backend runs a task due 10 hours ago before one due
    # 2 hours ago, even when enqueued after it.  Before, echomq claimed them in enqueue order.
    from shop.tasks import welcome

    now = datetime.datetime.now(datetime.timezone.utc)
    two = welcome.using(run_after=now - datetime.timedelta(hours=2)).enqueue(2)
    ten = welcome.using(run_after=now - datetime.timedelta(hours=10)).enqueue(10)
    client = admin_of(project)
    claimed = client.claim_many("later", 60_000, 100)  # "later": no worker runs it
    ours = {two.id, ten.id}
    assert [job.id for job in claimed if job.id in ours] == [ten.id, two.id]
    for job in claimed:  # the other tests' jobs go back as they were; ours go
        if job.id in ours:
            client.complete("later", job.id, job.token)
        else:
            client.release("later", job.id, job.token)


def test_enqueue_on_commit_waits_for_the_commit_and_a_rollback_sends_nothing(
    server: EmbeddedServer, project: dict[str, str]
) -> None:
    from django.db import transaction
    from shop.tasks import welcome

    client = admin(server)
    with transaction.atomic():
        kept = welcome.enqueue(1)
        assert client.job("later", kept.id) is None  # not before the commit
    info = client.job("later", kept.id)
    assert info is not None and info.state == "pending"
    with pytest.raises(RuntimeError), transaction.atomic():
        dropped = welcome.enqueue(2)
        raise RuntimeError("rolled back")
    assert client.job("later", dropped.id) is None
    outside = welcome.enqueue(3)  # no transaction: at once
    assert client.job("later", outside.id) is not None


def test_the_worker_command_refuses_a_backend_that_is_not_echomqs(project: dict[str, str]) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="nope"):
        call_command("echomq_worker", backend="nope")
    with pytest.raises(CommandError, match="ImmediateBackend, not an EchoMQBackend"):
        call_command("echomq_worker", backend="inline")


def test_a_job_naming_a_module_outside_the_apps_fails_without_importing_it(
    server: EmbeddedServer, project: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    client = admin(server)
    app = echomq.App(client)
    bad = [
        app.options(queue="default").enqueue("sideeffect.anything"),  # not an app: never imported
        app.options(queue="default").enqueue("json.dumps", {}),  # imported already, not a Django task
        app.options(queue="default").enqueue("shop.models.Order"),  # in an app, not a task
    ]
    for handle in bad:
        with pytest.raises(echomq.JobFailed, match="UnknownTask"):
            handle.result(timeout=30)
    assert not Path(project["ECHOMQ_DJANGO_DB"] + ".imported").exists()


# --- Django's own rules, as its backends' tests check them (issue 43) ---------------------------


def signals_of(project: dict[str, str], result_id: str) -> list[dict[str, Any]]:
    """The django.tasks signals sent for ``result_id``, in any process (shop/apps.py records them)."""
    path = Path(project["ECHOMQ_DJANGO_DB"] + ".signals")
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in map(json.loads, lines) if line["id"] == result_id]


def start_worker(project: dict[str, str], *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "echomq_worker", "--max-attempts", "1", *args],
        cwd=PROJECT, env={**os.environ, **project, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "echomq worker for" in first, first + proc.stdout.read()
    return proc


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


def test_a_backend_without_queues_takes_any_queue_and_finds_each_result_by_its_id(
    project: dict[str, str],
) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from shop.tasks import shout

    with pytest.raises(CommandError, match=r"any queue name.*--queue"):
        call_command("echomq_worker", backend="anyqueue")  # which queues to watch: it must be told
    here, there = shout.enqueue("hi"), shout.using(queue_name="elsewhere").enqueue("ho")
    assert shout.get_result(here.id).status == dtasks.TaskResultStatus.READY  # from its own queue
    proc = start_worker(project, "--backend", "anyqueue", "--queue", "anywhere", "--queue", "elsewhere")
    try:
        assert finished(here).return_value == "HI" and finished(there).return_value == "HO"
        again = shout.get_result(there.id)
        assert again.task.queue_name == "elsewhere" and again.return_value == "HO"
    finally:
        out = stop(proc)
    assert "worker of 'elsewhere' stopped" in out
    with pytest.raises(dtasks.exceptions.TaskResultDoesNotExist):
        shout.get_result("no-such-job@elsewhere")


def test_a_backend_without_queues_works_the_registered_ones_when_asked(project: dict[str, str]) -> None:
    """The any-queue path finds its queues in the queue registry (docs/concepts/registry.md), no SCAN."""
    from shop.tasks import shout

    backend = dtasks.task_backends["anyqueue"]
    shout.using(backend="anyqueue", queue_name="registered-one").enqueue("x")
    names = [w.queue for w in backend.worker(registered=True).workers]
    assert "registered-one" in names
    with pytest.raises(ValueError, match="name none"):
        backend.worker(["a"], registered=True)


def test_the_signals_are_sent_where_djangos_backends_send_them(
    project: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    from shop.tasks import add, out_of_stock

    ok = add.enqueue(1, 2)
    # In the producer, before enqueue() returns (the worker may have started it already: no order
    # between the two processes' lines).
    (enqueued,) = [line for line in signals_of(project, ok.id) if line["signal"] == "task_enqueued"]
    assert enqueued["signal"] == "task_enqueued" and enqueued["pid"] == os.getpid()
    assert enqueued["status"] == "READY" and enqueued["enqueued_at"] == ok.enqueued_at.isoformat()
    assert enqueued["sender"] == "EchoMQBackend"
    finished(ok)
    deadline = time.monotonic() + 10
    while len(signals_of(project, ok.id)) < 3:  # the worker writes its lines as the task ends
        assert time.monotonic() < deadline, signals_of(project, ok.id)
        time.sleep(0.05)
    started, done = [line for line in signals_of(project, ok.id) if line["pid"] == worker.pid]
    assert started["signal"] == "task_started" and started["pid"] == worker.pid
    assert started["status"] == "RUNNING" and started["attempts"] == 1 and started["started_at"]
    assert done["signal"] == "task_finished" and done["status"] == "SUCCESSFUL" and done["finished_at"]

    bad = finished(out_of_stock.enqueue("sku-2"))  # three tries (the worker's --max-attempts 3)
    deadline = time.monotonic() + 10
    while len(signals_of(project, bad.id)) < 7:
        assert time.monotonic() < deadline, signals_of(project, bad.id)
        time.sleep(0.05)
    names = [line["signal"] for line in signals_of(project, bad.id) if line["pid"] == worker.pid]
    assert names == ["task_started", "task_finished"] * 3  # each attempt: a retried one ends FAILED too
    last = signals_of(project, bad.id)[-1]
    assert last["status"] == "FAILED" and last["errors"] == ["builtins.LookupError"]
    assert last["attempts"] == 3


def test_enqueue_returns_what_get_result_reads(project: dict[str, str]) -> None:
    from shop.tasks import add, welcome

    result = welcome.enqueue(7)  # the "later" queue: no worker runs it, the job stays as enqueued
    again = welcome.get_result(result.id)
    assert again == result  # every field, enqueued_at too: the server's time, as the row holds it
    info = admin_of(project).job("later", result.id)
    assert info is not None and result.enqueued_at is not None
    assert result.enqueued_at.timestamp() * 1000 == info.enqueued_at
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    deferred = add.using(run_after=later, priority=-5).enqueue(1, 1)
    read = add.get_result(deferred.id)
    assert read.enqueued_at == deferred.enqueued_at and read.task.priority == -5
    assert read.task.run_after is not None and abs((read.task.run_after - later).total_seconds()) < 0.001
    admin_of(project).cancel("default", deferred.id)


def test_a_return_value_json_cannot_carry_fails_the_task_with_type_error(
    project: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    from shop.tasks import gives_a_set

    failed = finished(gives_a_set.enqueue())
    assert failed.status == dtasks.TaskResultStatus.FAILED
    assert failed.errors[-1].exception_class is TypeError  # Django's own backends' class, exactly


def test_get_result_never_imports_what_a_job_names(project: dict[str, str]) -> None:
    from django.core.exceptions import SuspiciousOperation

    backend = dtasks.task_backends["oncommit"]
    app = echomq.App(admin_of(project))
    for name in ("subprocess.check_output", "sideeffect.anything", "shop.models.Order", "shop.tasks.nope"):
        handle = app.options(queue="later").enqueue(name, ["true"])
        with pytest.raises(SuspiciousOperation, match=name):
            backend.get_result(handle.id)
    assert not Path(project["ECHOMQ_DJANGO_DB"] + ".imported").exists()


@pytest.mark.parametrize("task_name", ["exits", "interrupts"])
def test_a_task_raising_system_exit_fails_its_job_and_the_worker_goes_on(
    project: dict[str, str], task_name: str
) -> None:
    from shop import tasks

    proc = start_worker(project, "--backend", "exits")
    try:
        raising = getattr(tasks, task_name)
        failed = finished(raising.enqueue(3) if task_name == "exits" else raising.enqueue())
        assert failed.status == dtasks.TaskResultStatus.FAILED
        expected = SystemExit if task_name == "exits" else KeyboardInterrupt
        assert failed.errors[-1].exception_class is expected
        assert proc.poll() is None  # still working
        started = time.monotonic()
        assert finished(tasks.carries_on.enqueue(1), seconds=2).return_value == 2
        assert time.monotonic() - started < 2
    finally:
        started = time.monotonic()
        stop(proc)
    assert time.monotonic() - started < 2


def test_an_unknown_option_is_refused_naming_the_known_ones(project: dict[str, str]) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from echomq.contrib.django import EchoMQBackend

    with pytest.raises(ImproperlyConfigured, match=r"'url'.*DATABASE, ENQUEUE_ON_COMMIT, URL"):
        EchoMQBackend("typo", {"QUEUES": ["default"], "OPTIONS": {"url": "redis://127.0.0.1:7599/0"}})


def test_this_file_runs_on_django_6_and_python_3_12_too() -> None:
    """The suite's venv has the backport (Django 5.2, Python 3.11); this file runs again on Django 6.0."""
    if django.VERSION >= (6, 0):
        pytest.skip("this run is the Django 6 one")
    from tests.compat import django6

    python, why = django6.prepare()
    if python is None:
        pytest.skip(f"no Django 6 venv: {why}")
    ours = ("VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "ECHOMQ_URL", "ECHOMQ_DJANGO_DB")  # it makes its own
    env = {k: v for k, v in os.environ.items() if k not in ours}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "python")  # this tree's echomq
    # No --engine: the run takes this one's server binary from $ECHOMQ_SERVER_BIN (tests/conftest.py set it).
    run = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    last = out.strip().splitlines()[-1]
    # Every test ran there but this one (its own run's skip): a skip of any other is a gap, not a pass.
    assert re.fullmatch(r"\d+ passed, 1 skipped in [\d.]+s( \([\d:]+\))?", last), out[-3000:]

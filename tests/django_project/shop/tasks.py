"""The project's tasks: sync and async, with and without a context, one that fails."""

from __future__ import annotations

import sys

try:
    from django.tasks import TaskContext, task
except ImportError:
    from django_tasks import TaskContext, task

from .models import Order


@task(queue_name="mail", priority=10)
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    order.receipt_sent = True
    order.save()
    return f"receipt for {order.name}"


@task
async def add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def flaky(context: TaskContext, marker: str) -> dict[str, object]:
    if context.attempt == 1:
        raise ConnectionError("first try fails")
    return {"attempt": context.attempt, "id": context.task_result.id, "marker": marker}


@task
def out_of_stock(sku: str) -> None:
    raise LookupError(f"no stock of {sku}")


@task(backend="oncommit", queue_name="later")
def welcome(order_id: int) -> None:
    """Only ever enqueued here (the on-commit test); no worker runs the "later" queue."""


@task(backend="anyqueue", queue_name="anywhere")
def shout(word: str) -> str:
    """Of the backend that lists no QUEUES: enqueued to whatever queue ``using`` names."""
    return word.upper()


@task
def gives_a_set() -> set[int]:
    return {1, 2}  # JSON cannot carry it: the task fails with TypeError, as in Django's own backends


@task(backend="exits", queue_name="exits")
def exits(code: int) -> None:
    sys.exit(code)


@task(backend="exits", queue_name="exits")
def interrupts() -> None:
    raise KeyboardInterrupt


@task(backend="exits", queue_name="exits")
def carries_on(n: int) -> int:
    return n + 1

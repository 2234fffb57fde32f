"""The project's tasks: sync and async, with and without a context, one that fails."""

from __future__ import annotations

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

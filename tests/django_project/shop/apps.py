"""The shop app: its ``ready()`` records every ``django.tasks`` signal, in whichever process sends it.

Each signal appends one JSON line to ``$ECHOMQ_DJANGO_DB.signals`` (the test
process sends ``task_enqueued``, the worker ``task_started`` and
``task_finished``): tests/integrations/test_django.py reads them back.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.apps import AppConfig

try:
    from django.tasks import signals
except ImportError:
    from django_tasks import signals


def _record(name: str) -> Any:
    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        line = {
            "signal": name,
            "sender": sender.__name__,
            "id": task_result.id,
            "status": str(task_result.status),
            "pid": os.getpid(),
            "enqueued_at": task_result.enqueued_at and task_result.enqueued_at.isoformat(),
            "started_at": task_result.started_at and task_result.started_at.isoformat(),
            "finished_at": task_result.finished_at and task_result.finished_at.isoformat(),
            "errors": [e.exception_class_path for e in task_result.errors],
            "attempts": task_result.attempts,
        }
        with open(os.environ["ECHOMQ_DJANGO_DB"] + ".signals", "a") as out:
            out.write(json.dumps(line) + "\n")

    return receiver


RECEIVERS = {name: _record(name) for name in ("task_enqueued", "task_started", "task_finished")}


class ShopConfig(AppConfig):
    name = "shop"

    def ready(self) -> None:
        for name, receiver in RECEIVERS.items():
            getattr(signals, name).connect(receiver, dispatch_uid=f"shop-{name}")

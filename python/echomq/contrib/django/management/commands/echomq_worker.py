"""``manage.py echomq_worker``: run the ``django.tasks`` of an ``EchoMQBackend`` until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type hints
    help = "Run an echomq worker for the django.tasks of an EchoMQBackend (until SIGINT or SIGTERM)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias (default: default)")
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            help="a queue to work (repeat it; default: the backend's QUEUES, required when it lists none)",
        )
        parser.add_argument(
            "--registered",
            action="store_true",
            help="work every queue the queue registry lists now (a backend with QUEUES: [])",
        )
        parser.add_argument("--concurrency", type=int, default=4, help="tasks run at once per queue")
        parser.add_argument("--lease-ms", type=int, default=None, help="each job's lease (ms)")
        parser.add_argument("--max-attempts", type=int, default=None, help="tries before a job is dead")

    def handle(self, *args: Any, **options: Any) -> None:
        from echomq.contrib.django.backend import EchoMQBackend

        try:
            from django.tasks import task_backends  # Django 6.0+
        except ImportError:
            from django_tasks import task_backends
        try:
            backend = task_backends[options["backend"]]
        except Exception as exc:  # InvalidTaskBackendError: no such alias, or its settings are wrong
            raise CommandError(str(exc)) from exc
        if not isinstance(backend, EchoMQBackend):
            kind = type(backend).__name__
            raise CommandError(f"TASKS[{options['backend']!r}] is a {kind}, not an EchoMQBackend")
        settings: dict[str, Any] = {"concurrency": options["concurrency"]}
        for key in ("lease_ms", "max_attempts"):
            if options[key] is not None:
                settings[key] = options[key]
        try:
            worker = backend.worker(options["queues"], registered=options["registered"], **settings)
        except ValueError as exc:  # QUEUES: [] and no --queue; a --queue not in QUEUES
            raise CommandError(str(exc)) from exc
        queues = ", ".join(w.queue for w in worker.workers)
        self.stdout.write(f"echomq worker for {queues} ({backend.url}); SIGINT/SIGTERM stop it")
        worker.run()
        for w in worker.workers:
            self.stdout.write(f"worker of {w.queue!r} stopped: {w.stats}")

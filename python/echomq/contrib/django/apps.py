"""The Django app of ``echomq.contrib.django`` (``INSTALLED_APPS``: its ``manage.py echomq_worker``)."""

from __future__ import annotations

from django.apps import AppConfig


class EchoMQConfig(AppConfig):  # type: ignore[misc]  # Django ships no type hints
    name = "echomq.contrib.django"
    label = "echomq"
    verbose_name = "EchoMQ"

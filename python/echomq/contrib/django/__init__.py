"""A ``django.tasks`` backend on echomq (``echomq[django]``): ``@task`` functions run by echomq workers.

    # settings.py
    INSTALLED_APPS = [..., "echomq.contrib.django"]          # for manage.py echomq_worker
    TASKS = {
        "default": {
            "BACKEND": "echomq.contrib.django.EchoMQBackend",
            "QUEUES": ["default", "mail"],
            "OPTIONS": {"URL": "redis://127.0.0.1:6379/0"},
        }
    }

    $ python manage.py echomq_worker                    # every queue of the backend

Django 6.0's ``django.tasks``, or the ``django-tasks`` backport on older
Django (Python 3.10+).  See docs/guides/django.md for what maps to what.
"""

from __future__ import annotations

from .backend import EchoMQBackend

__all__ = ["EchoMQBackend"]

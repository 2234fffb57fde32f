"""A small Django project (SQLite) whose tasks run on echomq: tests/integrations/test_django.py.

``ECHOMQ_URL`` is the suite's server, ``ECHOMQ_DJANGO_DB`` the SQLite file the
test process and the worker process share.
"""

import os

SECRET_KEY = "tests-only"
USE_TZ = True
DEBUG = False
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

try:  # Django 6.0+ has django.tasks; older Django gets it from the django-tasks backport
    import django.tasks  # noqa: F401

    BACKPORT = []
except ImportError:
    BACKPORT = ["django_tasks"]

INSTALLED_APPS = [*BACKPORT, "echomq.contrib.django", "shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("ECHOMQ_DJANGO_DB", "db.sqlite3"),
        "OPTIONS": {"timeout": 20},
    }
}
URL = os.environ.get("ECHOMQ_URL", "redis://127.0.0.1:6379/0")
TASKS = {
    "default": {
        "BACKEND": "echomq.contrib.django.EchoMQBackend",
        "QUEUES": ["default", "mail"],
        "OPTIONS": {"URL": URL},
    },
    "oncommit": {
        "BACKEND": "echomq.contrib.django.EchoMQBackend",
        "QUEUES": ["later"],
        "OPTIONS": {"URL": URL, "ENQUEUE_ON_COMMIT": True},
    },
    # Django's rule: no QUEUES listed, any queue name is valid (a worker is told which to work)
    "anyqueue": {
        "BACKEND": "echomq.contrib.django.EchoMQBackend",
        "QUEUES": [],
        "OPTIONS": {"URL": URL},
    },
    # a worker of its own (tests/integrations/test_django.py): its tasks raise SystemExit and
    # KeyboardInterrupt
    "exits": {
        "BACKEND": "echomq.contrib.django.EchoMQBackend",
        "QUEUES": ["exits"],
        "OPTIONS": {"URL": URL},
    },
    # not echomq's: manage.py echomq_worker --backend inline refuses it
    "inline": {"BACKEND": f"{(BACKPORT or ['django.tasks'])[0]}.backends.immediate.ImmediateBackend"},
}

"""Integrations with other projects, each an optional extra: nothing here is imported by ``echomq``.

- ``echomq.contrib.otel``: OpenTelemetry traces across a task's enqueue and
  its attempts (``pip install echomq[otel]``).
"""

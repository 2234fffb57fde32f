"""How slow this machine is right now, so that a test whose subject is a time bound scales it.

A test that checks an invariant holds it however slow the machine; a test whose subject is
a time bound ("a second signal exits at once", "stop() returns within the grace") asserts
``took < budget(1.0)``: the bound as written on an idle machine, times ``slowness()``.

``slowness()`` is measured once per run (``tests/conftest.py`` calls ``calibrate()`` in the
controller and hands the figure to pytest-xdist's workers in ``$ECHOMQ_TEST_SLOWNESS``): a
fixed CPU-bound workload and a fixed number of round trips to a server of its own, each
against the time it takes on an idle machine (``REFERENCE_*``, measured on the two-core
development machine), the worse of the two, never below 1.  The report header prints it.
``ECHOMQ_TEST_SLOWNESS=4 make test`` forces a figure (a machine you know will get busier).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from echomq.testing import EmbeddedServer

ENV = "ECHOMQ_TEST_SLOWNESS"
# What the workloads take on an idle machine: the fastest of thirty runs of each on the
# two-core development machine (2026-12-02).
REFERENCE_CPU_S = 0.035
REFERENCE_ROUND_TRIPS_S = 0.020
ROUND_TRIPS = 500
# A machine this slow fails time bounds whatever their budget: beyond it, say so in the
# header and leave the bounds at what they would be here.
MAX_SLOWNESS = 20.0


@dataclass(frozen=True)
class Calibration:
    slowness: float
    cpu_s: float | None = None
    round_trips_s: float | None = None
    forced: bool = False

    def describe(self) -> str:
        if self.forced:
            return f"slowness: {self.slowness:.1f} (forced: ${ENV})"
        parts = []
        if self.cpu_s is not None:
            parts.append(f"CPU workload {self.cpu_s * 1000:.0f} ms vs {REFERENCE_CPU_S * 1000:.0f} ms idle")
        if self.round_trips_s is not None:
            parts.append(
                f"{ROUND_TRIPS} round trips {self.round_trips_s * 1000:.0f} ms "
                f"vs {REFERENCE_ROUND_TRIPS_S * 1000:.0f} ms idle"
            )
        capped = f", capped at {MAX_SLOWNESS:.0f}" if self.slowness >= MAX_SLOWNESS else ""
        return f"slowness: {self.slowness:.1f} ({'; '.join(parts)}{capped}): time bounds scale by it"


def _cpu_workload() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(400_000):
        total += i * i % 7
    assert total > 0
    return time.perf_counter() - started


def _round_trips(server: EmbeddedServer) -> float:
    conn = server.client(socket_timeout=30)
    try:
        conn.ping()  # connected before the clock starts
        started = time.perf_counter()
        for _ in range(ROUND_TRIPS):
            conn.ping()
        return time.perf_counter() - started
    finally:
        conn.close()


def measure(runs: int = 5) -> Calibration:
    """Run both workloads ``runs`` times (the median of each counts) and compare them with the reference."""
    cpu = statistics.median(_cpu_workload() for _ in range(runs))
    trips: float | None = None
    try:
        server = EmbeddedServer(load_module=False, wrapper=[]).start()  # the machine, not a memory checker
    except (OSError, RuntimeError):  # no server binary: the CPU alone says it
        server = None
    if server is not None:
        try:
            trips = statistics.median(_round_trips(server) for _ in range(runs))
        finally:
            server.stop()
    ratios = [cpu / REFERENCE_CPU_S] + ([trips / REFERENCE_ROUND_TRIPS_S] if trips is not None else [])
    slowness = min(MAX_SLOWNESS, max(1.0, *ratios))
    return Calibration(round(slowness, 1), cpu, trips)


_current: Calibration | None = None


def calibrate() -> Calibration:
    """The run's calibration: ``$ECHOMQ_TEST_SLOWNESS`` if set (forced, or the controller's), or measured."""
    global _current
    if _current is None:
        given = os.environ.get(ENV)
        if given:
            _current = Calibration(max(1.0, float(given)), forced=True)
        else:
            _current = measure()
            os.environ[ENV] = str(_current.slowness)  # for the workers xdist starts after this
    return _current


def slowness() -> float:
    """How many times slower than idle this machine runs the suite's workloads (>= 1)."""
    return calibrate().slowness


def budget(seconds: float, *, under: float | None = None) -> float:
    """A time bound written for an idle machine, scaled to this one.

    ``under``: the time the behaviour the bound rules out would take (a 30 s grace waited
    out, a 3 s poll): the budget stays below it, so a slow machine still tells the two apart.
    """
    scaled = seconds * slowness()
    return scaled if under is None else max(seconds, min(scaled, under * 0.9))

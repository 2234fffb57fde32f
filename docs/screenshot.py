"""The dashboard during a demo, as a picture: ``docs/dashboard.png`` (shown in docs/guides/operating.md).

    .venv/bin/python docs/screenshot.py                 # writes docs/dashboard.png
    .venv/bin/python docs/screenshot.py --out /tmp/x.png --seconds 20

A server of its own (EmbeddedServer), four queues with real workers (with
``echomq.metrics.Metrics``, so the chart has throughput), a reaper, jobs
that fail into the dead set, jobs whose holder vanished (the reaper recovers
them), a paused queue, a running job with a cancel request; then Debian's
chromium (through Playwright, never a downloaded browser) opens the
dashboard and takes the screenshot.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

import echomq
from echomq.dashboard import Dashboard, DashboardServer
from echomq.metrics import Metrics
from echomq.testing import EmbeddedServer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--headless=new", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def mail(job: echomq.Job, cancel: echomq.CancelToken) -> None:
    cancel.sleep(random.uniform(0.02, 0.08))


def thumbnails(job: echomq.Job, cancel: echomq.CancelToken) -> None:
    cancel.sleep(random.uniform(0.05, 0.25))
    if job.payload.startswith(b"corrupt"):
        raise ValueError(f"cannot decode image {job.payload.decode()!r}: truncated JPEG (SOS marker missing)")
    cancel.raise_if_cancelled()


def reports(job: echomq.Job, cancel: echomq.CancelToken) -> None:
    for _ in range(600):
        if cancel.sleep(0.05):
            cancel.raise_if_cancelled()


def produce(client: echomq.Client, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        client.enqueue("mail", f'{{"to": "user{n}@example.com"}}', job_id=f"mail-{n:05d}")
        if n % 3 == 0:
            image = b"corrupt-%d.jpg" % n if n % 90 == 0 else b"img-%d.jpg" % n
            client.enqueue("thumbnails", image, job_id=f"thumb-{n:05d}")
        if n % 11 == 0:
            # A worker that claimed a job and vanished: its lease lapses, the reaper recovers it.
            client.enqueue("thumbnails", b"img-orphan-%d.jpg" % n, job_id=f"thumb-{n:05d}-b")
            client.claim("thumbnails", lease_ms=400)
        stop.wait(random.uniform(0.03, 0.09))


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", default=str(Path(__file__).with_name("dashboard.png")))
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the demo runs before the shot")
    args = parser.parse_args()
    random.seed(19)
    from playwright.sync_api import sync_playwright

    with EmbeddedServer() as server:
        client = echomq.Client(server.client())
        metrics = Metrics(CollectorRegistry(), flush_interval=0.25, redis=server.client())
        for i in range(40):
            client.enqueue("billing", f'{{"invoice": {1000 + i}}}', job_id=f"invoice-{1000 + i}")
        client.pause("billing")
        for i in range(3):
            client.enqueue("reports", b"q3", job_id=f"report-2026-q{i + 1}")
        stop = threading.Event()
        workers = [
            echomq.Worker(client, "mail", mail, concurrency=3, lease_ms=5_000, metrics=metrics),
            echomq.Worker(client, "thumbnails", thumbnails, concurrency=3, max_attempts=2, metrics=metrics),
            echomq.Worker(client, "reports", reports, concurrency=2, lease_ms=20_000, metrics=metrics),
        ]
        reapers = [
            echomq.Reaper(client, queue, interval=0.5, max_stalled=3, metrics=metrics)
            for queue in ("thumbnails", "mail")
        ]
        producer = threading.Thread(target=produce, args=(client, stop), daemon=True)
        dashboard = Dashboard.from_url(
            server.url, interval=0.5, history_seconds=max(30.0, args.seconds), discover_every=0.5
        )
        for w in workers:
            w.start()
        for r in reapers:
            r.start()
        try:
            with DashboardServer(dashboard) as web:
                producer.start()
                print(f"dashboard at {web.url} (demo running {args.seconds:.0f} s)")
                time.sleep(args.seconds / 2)
                active = client.active("reports")
                if active:
                    client.cancel("reports", active[0].id, "customer withdrew the request")
                # An id and an error carrying markup show as text (the XSS probe of the tests).
                client.enqueue("thumbnails", b"corrupt", job_id="<img src=x onerror=alert(1)>.jpg")
                time.sleep(args.seconds / 2)
                with sync_playwright() as p:
                    browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                    page = browser.new_page(viewport={"width": 1480, "height": 1000}, device_scale_factor=1)
                    page.goto(web.url + "#queue=thumbnails")
                    page.wait_for_selector("#dead tbody tr")
                    page.wait_for_selector("#chart polyline")
                    time.sleep(1.5)
                    page.screenshot(path=args.out, full_page=True)
                    browser.close()
                print(f"wrote {args.out}")
        finally:
            stop.set()
            for w in workers:
                w.stop(timeout=5)
            for r in reapers:
                r.stop()


if __name__ == "__main__":
    main()

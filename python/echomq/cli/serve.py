"""What serves until stopped, and the tools around a server: exporter, dashboard, server,
module-path, demo."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ._common import CliError, Command, connect, log_to_stderr, port, positive, stop_on_sigterm


def cmd_exporter(args: argparse.Namespace) -> int:
    try:
        from ..metrics import exporter_registry, serve
    except ImportError as exc:
        raise CliError(str(exc)) from exc
    log_to_stderr()
    registry, _collector, watch = exporter_registry(
        connect(args),
        args.queues or None,
        max_queues=args.max_queues,
        scan_budget=args.scan_budget,
        discover_every=args.discover_every,
        cancel_latency=not args.no_cancel_latency,
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    server = serve(args.port, args.host, registry)
    host, bound = server.server_address[:2]
    print(f"metrics of {' '.join(args.queues) or 'every queue'} at http://{host}:{bound}/metrics", flush=True)
    try:
        stopping.wait(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        if watch is not None:
            watch.stop()
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        from ..dashboard import Dashboard, DashboardServer
    except ImportError as exc:
        raise CliError(str(exc)) from exc
    log_to_stderr()
    token = args.token or os.environ.get("ECHOMQ_DASHBOARD_TOKEN") or None
    dashboard = Dashboard.from_url(
        args.url,
        cluster=args.cluster,
        queues=args.queues or None,
        read_only=args.read_only,
        token=token,
        show_payloads=args.show_payloads,
        interval=args.interval,
    )
    server = DashboardServer(dashboard, args.host, args.port)  # refuses a non-loopback host without a token
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    server.start()
    login = "?token=<token>" if token else ""
    print(f"dashboard at {server.url}{login}  (Ctrl-C or SIGTERM stops it)", flush=True)
    try:
        stopping.wait(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    from ..testing import EmbeddedServer

    stopping = stop_on_sigterm()
    server = EmbeddedServer(args.server_args, port=args.port)
    try:
        server.start()
    except (RuntimeError, FileNotFoundError) as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    try:
        print(f"redis-server {server.url}  --loadmodule {server.module}", flush=True)
        # The other commands go to $ECHOMQ_URL (else localhost:6379): say how to send them here.
        print(f"point the CLI at it, in another shell:  export ECHOMQ_URL={server.url}", flush=True)
        print("Ctrl-C or SIGTERM stops it", flush=True)
        assert server.process is not None
        while server.process.poll() is None and not stopping():
            time.sleep(0.1)
        if stopping():
            return 0
        raise CliError(f"the server exited: {server.log_tail(1)}")
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def cmd_module_path(args: argparse.Namespace) -> int:
    from .._module_so import module_path

    try:
        print(module_path())
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from exc
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .._demo import run

    run()
    return 0


class Deprecated(argparse.Action):
    """An old option name: stores into the new one's ``dest`` and says, on stderr, to use the new one."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        new = "--" + self.dest.replace("_", "-")
        print(f"echomq: {option_string} is deprecated and will go: use {new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def register(command: Command) -> None:
    p = command("exporter", "serve the queues' Prometheus metrics (echomq[metrics])", cmd_exporter)
    p.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to export (default: discover them)")
    p.add_argument("--port", type=int, default=9640, help="HTTP port (default 9640; 0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--addr", dest="host", action=Deprecated, help="the old name of --host (deprecated: it warns)"
    )
    p.add_argument("--max-queues", type=positive, default=100, help="queues discovered, at most (100)")
    p.add_argument(
        "--scan-budget",
        type=positive,
        default=100_000,
        help="keys the SCAN that fills the registry's index examines at most",
    )
    p.add_argument("--discover-every", type=float, default=30.0, help="seconds between discoveries")
    p.add_argument("--no-cancel-latency", action="store_true", help="do not follow cancels (no PSUBSCRIBE)")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")

    p = command("dashboard", "serve the web dashboard (echomq[dashboard])", cmd_dashboard)
    p.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to show (default: discover them)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other needs a token)"
    )
    p.add_argument("--port", type=int, default=8640, help="HTTP port (default 8640; 0: a free one)")
    p.add_argument("--token", default=None, help="asked of every request (default: $ECHOMQ_DASHBOARD_TOKEN)")
    p.add_argument("--read-only", action="store_true", help="no actions: no pause, cancel, retry or purge")
    p.add_argument("--show-payloads", action="store_true", help="show job payloads (hidden by default)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")

    p = command("server", "start a local redis-server with the module loaded", cmd_server)
    p.add_argument("--port", type=port, default=None, help="port (default: a free one)")
    p.add_argument("server_args", nargs="*", help="extra redis-server options, after --")

    command("module-path", "print the emq.so path for --loadmodule", cmd_module_path)
    command("demo", "run the lifecycle demo on a server of its own", cmd_demo)

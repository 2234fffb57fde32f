"""The web dashboard: every queue, its jobs and its controls, live (``echomq dashboard``).

``pip install 'echomq[dashboard]'``.  A small ASGI app (Starlette) served by
uvicorn; the page is static HTML, CSS and hand-written JavaScript shipped in
the package (no CDN, no third-party JS), which polls one JSON endpoint every
second and builds the page with DOM text nodes only.

    from echomq.dashboard import Dashboard, DashboardServer

    app = Dashboard.from_url("redis://localhost:6379/0").app()      # any ASGI server
    with DashboardServer(Dashboard.from_url(url), port=0) as server:  # or uvicorn in a thread
        print(server.url)

Security (docs/guides/operating.md, "The dashboard"): loopback by default; any other address
needs a token; actions are POSTs with a CSRF token; ``read_only`` removes
them; payloads are never shown unless ``show_payloads``; everything that
comes from Redis is text, never markup.
"""

from __future__ import annotations

from .app import Dashboard, DashboardServer, is_loopback

__all__ = ["Dashboard", "DashboardServer", "is_loopback"]

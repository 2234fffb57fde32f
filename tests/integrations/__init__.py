"""Django, FastAPI, OpenTelemetry, the metrics exporter, the dashboard, the CLI."""

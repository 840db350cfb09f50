"""The status dashboard: a read-only REST API, Prometheus metrics and a live web page over a run directory.

It only reads the run directory (docs/architecture.md), so the same app serves a live aggregator run
and a finished simulator run.
"""

from server.dashboard.app import create_app
from server.dashboard.serve import DashboardServer, serve_dashboard

__all__ = ["DashboardServer", "create_app", "serve_dashboard"]

"""A finished run, served read-only: what ``python -m server`` does when its ``--out`` already holds a run
that ended successfully (a container restarted after ``done``, ``docker compose up`` again).

Nothing in the run directory is written: the dashboard shows the run as it ended, the gRPC port answers
health probes (so orchestrators see a healthy service) and refuses registrations with the same
FAILED_PRECONDITION "the run is over" that a live aggregator sends after its last round, which workers take
as "nothing to do" and exit 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fedent import runlog
from fedent.rounds.rundir import finished_status
from fedentrpc.health import add_health_and_reflection
from fedentrpc.security.flags import ServerSecurity
from fedentrpc.security.tls import bind
from fedentrpc.serving import create_server
from fedentrpc.stream_limit import StreamLimits
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AggregatorService"].full_name
RUN_OVER = "the run is over (finished); nothing to do"
FINISHED_THREADS = 4  # every worker call is refused at once; health has a pool of its own


def finished_run(run_dir: str | Path) -> dict[str, Any] | None:
    """status.json of ``run_dir`` when the run finished successfully (phase done, final model written)."""
    return finished_status(runlog.RunPaths(Path(run_dir)))


class FinishedServicer(pb_grpc.AggregatorServiceServicer):
    """Every worker call is refused: the run has nothing left to do."""

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterResponse:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, RUN_OVER)
        raise AssertionError("unreachable")  # abort raises

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(known=False)


@dataclass
class FinishedHandle:
    server: grpc.Server
    port: int
    dashboard: Any = None
    dashboard_url: str | None = None

    def stop(self, grace_s: float = 2.0) -> None:
        self.server.stop(grace_s).wait(grace_s + 1)
        if self.dashboard is not None:
            self.dashboard.stop()


def serve_finished(run_dir: str | Path, host: str, port: int, security: ServerSecurity | None = None, *,
                   dashboard: bool = False, dashboard_port: int = 0, dashboard_token: str | None = None,
                   limits: StreamLimits | None = None) -> FinishedHandle:
    """Health + refusals on ``host:port`` and, with ``dashboard``, the run's dashboard; writes nothing.

    ``limits``: the stream limits (the aggregator's settings'); health runs on its own pool
    (:mod:`fedentrpc.serving`), so open streams cannot silence it.
    """
    from server.app import start_dashboard

    sec = security or ServerSecurity(insecure=True)
    server = create_server(sec, FINISHED_THREADS, limits or StreamLimits(), name="finished")
    pb_grpc.add_AggregatorServiceServicer_to_server(FinishedServicer(), server)
    add_health_and_reflection(server, [SERVICE_NAME])
    try:
        bound = bind(server, f"{host}:{port}", sec)
    except (ValueError, RuntimeError):
        raise OSError(f"cannot bind the aggregator to {host}:{port}") from None
    server.start()
    dash, url = (start_dashboard(Path(run_dir), host, dashboard_port, dashboard_token) if dashboard
                 else (None, None))
    return FinishedHandle(server, bound, dash, url)

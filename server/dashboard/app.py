"""The dashboard's FastAPI app: read-only JSON routes, Prometheus metrics, an SSE change feed and the page.

``create_app`` only needs a run directory, so the aggregator mounts it on its live run and
``fedent dashboard RUN_DIR`` serves a finished simulator run with the same code.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, PlainTextResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

from server.dashboard import auth, page, prometheus, views
from server.dashboard.models import (
    ClientsOut,
    ConfigOut,
    EstimatorOut,
    Health,
    PartitionOut,
    RoundsPage,
    StatusOut,
)
from server.dashboard.rundir import RunDirReader

STATIC_DIR = Path(__file__).parent / "static"
SWAGGER_DIR = STATIC_DIR / "swagger"  # swagger-ui-dist, vendored (see its README.md): /docs works offline
MAX_PAGE = 1000
# The page loads only its own files and talks only to this server; no inline script or style.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                               "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",  # the page may be opened with ?token=
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
# Swagger UI's own options; validatorUrl null: never send the schema to validator.swagger.io.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}
# Declared on every guarded route, so the schema shows the answer a request without the token gets.
UNAUTHORIZED_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or invalid bearer token (only when the dashboard has a token; the answer "
                         "carries 'WWW-Authenticate: Bearer')",
          "content": {"application/json": {"schema": {  # JSON also on /metrics, whose 200 is text
              "type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}}}},
}
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)
# The page's scripts are ES modules (<script type="module">, import/export), which a browser runs only when served
# with a JavaScript MIME type; say so explicitly rather than trust the host's mime tables (Windows' registry can map
# .js to text/plain).
STATIC_TYPES = {".js": "text/javascript; charset=utf-8"}


class _StaticFiles(StaticFiles):
    """StaticFiles with the content types of ``STATIC_TYPES`` fixed, whatever ``mimetypes`` says."""

    def file_response(self, full_path: str | os.PathLike[str], stat_result: os.stat_result, scope: Scope,
                      status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        kind = STATIC_TYPES.get(Path(full_path).suffix)
        if kind is not None and response.status_code != 304:
            response.headers["content-type"] = kind
        return response


def docs_headers(body: str) -> dict[str, str]:
    """/docs may load and connect to this server only; its one inline script is allowed by its hash.

    Swagger UI sets inline styles from script (React), hence 'unsafe-inline' for styles only.
    """
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(m.group(1).encode("utf-8")).digest()).decode("ascii") + "'"
        for m in _INLINE_SCRIPT.finditer(body))
    return {
        "Content-Security-Policy": f"default-src 'self'; script-src 'self' {hashes}; "
                                   "style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
                                   "base-uri 'none'; frame-ancestors 'none'",
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-cache",
    }


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def create_app(
    run_dir: Path,
    token: str | None = None,
    *,
    poll_interval_s: float = 0.5,
    keepalive_s: float = 10.0,
    stale_after_s: float = 30.0,
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    """Build the app for one run directory; with ``token`` set, data routes require ``Authorization: Bearer``."""
    if token is not None and not token.strip():
        raise ValueError("dashboard token must not be empty")
    reader = RunDirReader(Path(run_dir))
    app = FastAPI(
        title="FedEnt dashboard",
        version="1",
        description="Read-only status of one FedEnt run directory (simulator or cluster).",
        docs_url=None,  # served below from the vendored Swagger UI, not from a CDN
        redoc_url=None,
    )
    app.state.reader = reader
    app.state.stopping = threading.Event()  # set by the server handle so open SSE streams end promptly

    def require_token(request: Request, _: HTTPAuthorizationCredentials | None = Depends(auth.bearer_scheme)) -> None:
        auth.check(token, request)

    api = APIRouter(prefix="/api", tags=["api"], responses=UNAUTHORIZED_RESPONSES)
    guarded = [Depends(require_token)]

    @api.get("/status", response_model=StatusOut, dependencies=guarded)
    def get_status() -> StatusOut:
        return views.build_status(reader.snapshot(), clock())

    @api.get("/rounds", response_model=RoundsPage, dependencies=guarded)
    def get_rounds(
        offset: int = Query(0, ge=0, description="first round row to return"),
        limit: int = Query(100, ge=1, le=MAX_PAGE, description="rows per page"),
    ) -> RoundsPage:
        return views.build_rounds(reader.snapshot(), offset, limit)

    @api.get("/clients", response_model=ClientsOut, dependencies=guarded)
    def get_clients() -> ClientsOut:
        return views.build_clients(reader.snapshot(), clock(), stale_after_s)

    @api.get("/estimator", response_model=EstimatorOut, dependencies=guarded)
    def get_estimator() -> EstimatorOut:
        return views.build_estimator(reader.snapshot())

    @api.get("/config", response_model=ConfigOut, dependencies=guarded)
    def get_config() -> ConfigOut:
        return views.build_config(reader.snapshot())

    @api.get("/partition", response_model=PartitionOut, dependencies=guarded)
    def get_partition() -> PartitionOut:
        return views.build_partition(reader.snapshot())

    @api.get("/events", response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"}})
    async def get_events(
        request: Request,
        token_param: str | None = Query(None, alias="token", description="bearer token (EventSource sends no headers)"),
    ) -> StreamingResponse:
        """``change`` events naming the run files that changed; polled every ``poll_interval_s`` seconds."""
        auth.check(token, request, allow_query=True)
        del token_param  # read via auth.check; declared only for the OpenAPI schema
        return StreamingResponse(
            _event_stream(request), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _event_stream(request: Request) -> AsyncIterator[str]:
        stopping: threading.Event = app.state.stopping
        last = reader.stamps()
        yield "retry: 1000\n\n"
        yield _sse("hello", _brief(list(last)))
        quiet_since = time.monotonic()
        while not stopping.is_set():
            await asyncio.sleep(poll_interval_s)
            if await request.is_disconnected():
                break
            now = reader.stamps()
            changed = [name for name, stamp in now.items() if last.get(name) != stamp]
            if changed:
                last = now
                quiet_since = time.monotonic()
                yield _sse("change", _brief(changed))
            elif time.monotonic() - quiet_since > keepalive_s:
                quiet_since = time.monotonic()
                yield ": keepalive\n\n"

    def _brief(files: list[str]) -> dict[str, Any]:
        st = views.mapping(reader.status())
        return {"files": files, "phase": views.text(st.get("phase")), "round": views.integer(st.get("round"))}

    app.include_router(api)

    @app.get("/healthz", response_model=Health, tags=["ops"])
    def healthz() -> Health:
        return Health()

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=guarded, tags=["ops"],
             responses=UNAUTHORIZED_RESPONSES)
    def metrics() -> PlainTextResponse:
        snap = reader.snapshot()
        now = clock()
        body = prometheus.render(
            views.build_status(snap, now), snap.rounds,
            views.build_clients(snap, now, stale_after_s), views.build_estimator(snap), snap.status,
        )
        return PlainTextResponse(body, media_type=prometheus.CONTENT_TYPE)

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    def index() -> HTMLResponse:
        """The page, with the run's state in it (only when no token guards the data: the page itself is open)."""
        snap = reader.snapshot() if token is None else None
        body = page.render_index(STATIC_DIR / "index.html", snap, clock(), stale_after_s)
        return HTMLResponse(body, headers=PAGE_HEADERS)

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    def docs(request: Request) -> HTMLResponse:
        """Swagger UI from this package's files: no CDN, so the schema is browsable offline."""
        root = str(request.scope.get("root_path", "")).rstrip("/")
        html = get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or "/openapi.json"), title=f"{app.title} - API",
            swagger_js_url=f"{root}/static/swagger/swagger-ui-bundle.js",
            swagger_css_url=f"{root}/static/swagger/swagger-ui.css",
            swagger_favicon_url=f"{root}/static/swagger/favicon-32x32.png",
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )
        body = bytes(html.body).decode("utf-8")
        return HTMLResponse(body, headers=docs_headers(body))

    app.mount("/static", _StaticFiles(directory=STATIC_DIR), name="static")
    return app

"""A small driver for headless Chromium over the DevTools protocol, for the dashboard's browser tests.

Chromium is started with ``--remote-debugging-port=0``; the port it picked is read from the
``DevToolsActivePort`` file in its private user-data dir, and one page target is driven over a websocket
(``websocket-client``). Only what the tests need: navigate, evaluate, wait for a condition, screenshot,
and a record of uncaught page exceptions.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import websocket

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
)


class BrowserError(RuntimeError):
    pass


class Chromium:
    """``with Chromium() as page: page.navigate(url); page.wait_for("expr")``."""

    def __init__(self, width: int = 1366, height: int = 768, binary: str = CHROMIUM, start_timeout_s: float = 20.0):
        self.width, self.height = width, height
        self.binary = binary
        self.start_timeout_s = start_timeout_s
        self.user_dir = Path(tempfile.mkdtemp(prefix="fedent-chromium-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.ws: websocket.WebSocket | None = None
        self._next_id = 0
        self.exceptions: list[str] = []  # uncaught page errors, as one-line descriptions
        self.console_errors: list[str] = []

    # ---- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> Chromium:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        args = [self.binary, *FLAGS, f"--user-data-dir={self.user_dir}", "--remote-debugging-port=0",
                f"--window-size={self.width},{self.height}", "about:blank"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port = self._devtools_port()
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
        pages = [t for t in targets if t.get("type") == "page"]
        if not pages:
            raise BrowserError("chromium has no page target")
        # suppress_origin: Chromium rejects DevTools websockets whose Origin it does not allow.
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=10, suppress_origin=True)
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  width=self.width, height=self.height, deviceScaleFactor=1, mobile=False)

    def _devtools_port(self) -> int:
        marker = self.user_dir / "DevToolsActivePort"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise BrowserError(f"chromium exited with {self.proc.returncode}: {err.strip()[-400:]}")
            try:
                first = marker.read_text().splitlines()[0]
                return int(first)
            except (OSError, IndexError, ValueError):
                time.sleep(0.05)
        raise BrowserError("chromium did not open its DevTools port in time")

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass
            self.ws = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        shutil.rmtree(self.user_dir, ignore_errors=True)

    # ---- protocol -------------------------------------------------------------------------------------------
    def call(self, method: str, timeout_s: float = 15.0, **params: Any) -> dict[str, Any]:
        """Send one command and return its result, recording events that arrive meanwhile."""
        if self.ws is None:
            raise BrowserError("browser not started")
        self._next_id += 1
        mid = self._next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no reply within {timeout_s} s")
            self.ws.settimeout(left)
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error'].get('message')}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        method = msg.get("method")
        params = msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            desc = d.get("exception", {}).get("description") or d.get("text", "exception")
            self.exceptions.append(str(desc).splitlines()[0])
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            args = params.get("args", [])
            self.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))

    def evaluate(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise BrowserError(f"evaluate({expression!r}) threw: {res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    def navigate(self, url: str, timeout_s: float = 15.0) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout_s)

    def wait_for(self, expression: str, timeout_s: float = 10.0, poll_s: float = 0.1) -> Any:
        """Poll ``expression`` until it is truthy; return its value (BrowserError with the last value on timeout)."""
        deadline = time.monotonic() + timeout_s
        value: Any = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except BrowserError:
                value = None  # e.g. while the page is navigating
            if value:
                return value
            time.sleep(poll_s)
        raise BrowserError(f"timed out after {timeout_s} s waiting for {expression!r} (last value {value!r})")

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)") or self.height)
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1})
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

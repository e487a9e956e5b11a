"""A real headless Chromium driven over the DevTools protocol, for tests of web pages (and screenshots).

Debian's ``chromium`` (installed by ``scripts/setup.sh``) runs with a fresh profile and no network
chatter; the protocol is spoken over one WebSocket (the ``websockets`` library). A page's console
errors and uncaught exceptions are collected so a test can assert there were none.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--no-first-run", "--disable-sync", "--disable-extensions", "--disable-default-apps", "--mute-audio",
         "--remote-debugging-port=0")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(RuntimeError):
    pass


class Browser:
    """One Chromium process and one page (tab); ``with Browser() as b: b.open(url)``."""

    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 30.0):
        from websockets.sync.client import connect

        exe = chromium_path()
        if exe is None:
            raise BrowserError("chromium is not installed (scripts/setup.sh installs it)")
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="cuvil-chromium-")
        self._proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.is_file() and len(port_file.read_text().splitlines()) >= 2):
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.close()
                raise BrowserError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self._stack = contextlib.ExitStack()
        self._ws = self._stack.enter_context(connect(f"ws://127.0.0.1:{port}{path}", max_size=None,
                                                     open_timeout=timeout))
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self._page_start = 0
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False})

    # protocol ---------------------------------------------------------------------------------------
    def _call(self, method: str, params: dict | None = None, session: str | None = None) -> dict[str, Any]:
        ident = next(self._ids)
        msg = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._ws.send(json.dumps(msg))
        deadline = time.monotonic() + self.timeout
        while True:
            reply = json.loads(self._ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == ident:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def call(self, method: str, params: dict | None = None) -> dict[str, Any]:
        return self._call(method, params, self._session)

    def _wait_event(self, method: str, since: int) -> None:
        deadline = time.monotonic() + self.timeout
        while not any(e["method"] == method for e in self.events[since:]):
            if time.monotonic() > deadline:
                raise BrowserError(f"no {method} within {self.timeout} s")
            try:
                self.events.append(json.loads(self._ws.recv(timeout=0.2)))
            except TimeoutError:
                pass

    # what a test uses -------------------------------------------------------------------------------
    def open(self, url: str) -> None:
        """Load ``url``; :meth:`errors` reports from here on (the previous page's are left behind)."""
        self._drain()
        since = self._page_start = len(self.events)
        self.call("Page.navigate", {"url": url})
        self._wait_event("Page.loadEventFired", since)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression!r} threw: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"{expression!r} stayed false")
            time.sleep(0.1)

    def errors(self) -> list[str]:
        """Console errors, failed loads and uncaught exceptions of the page last opened."""
        self._drain()
        out = []
        for e in self.events[self._page_start:]:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(p["exceptionDetails"].get("text", "exception"))
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e["method"] == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text", "error"))
        return out

    def _drain(self) -> None:
        while True:
            try:
                self.events.append(json.loads(self._ws.recv(timeout=0.05)))
            except TimeoutError:
                return

    def screenshot(self, path: str | Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        data = base64.b64decode(self.call("Page.captureScreenshot", params)["data"])
        out = Path(path)
        out.write_bytes(data)
        return out

    def close(self) -> None:
        try:
            if getattr(self, "_ws", None) is not None:
                try:
                    self._call("Browser.close")
                except Exception:
                    pass
                self._stack.close()
        finally:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Headless Chromium for a test: Debian's ``chromium``, driven over the DevTools protocol.

:func:`chromium` starts the browser (the flags that work on these machines, a fresh profile)
with ``--remote-debugging-port=0``, reads the port it chose from its stderr and opens the page
target's WebSocket (``websocket-client``, which the kubernetes client already brings). A
:class:`Page` sets a cookie (what a login leaves in a browser), navigates and waits for the
load, records every response's status, evaluates JavaScript, and takes screenshots. The browser
is stopped by PID in a ``finally``.

``make chromium`` installs the browser; without it the caller skips (fails under ``CI``).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
"""What works here (no display, root, no GPU, no network beyond loopback)."""


def binary() -> str:
    """The Chromium binary; skip (fail under ``CI``) when it is not installed."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "no chromium on PATH: `make chromium` installs Debian's package"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


class Page:
    """One page target of the browser, over its DevTools WebSocket."""

    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.statuses: dict[str, int] = {}
        self.call("Page.enable")
        self.call("Network.enable")
        self.call("Runtime.enable")

    def _receive(self) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(self.ws.recv())
        if message.get("method") == "Network.responseReceived":
            response = message["params"]["response"]
            self.statuses[response["url"]] = int(response["status"])
        if "method" in message:
            self.events.append(message)
        return message

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (raise on a protocol error)."""
        ident = next(self.ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = self._receive()
            if message.get("id") == ident:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    def size(self, width: int, height: int) -> None:
        """The viewport (and the screenshot) size."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def set_cookie(self, url: str, name: str, value: str) -> None:
        """A cookie for ``url``'s site (what the UI's login leaves in the browser)."""
        ok = self.call("Network.setCookie", url=url, name=name, value=value, path="/")
        assert ok.get("success", True), ok

    def clear_cookies(self) -> None:
        """Forget every cookie (a browser nobody logged in with)."""
        self.call("Network.clearBrowserCookies")

    def goto(self, url: str, timeout_s: float = 60.0) -> int | None:
        """Navigate and wait for the load event; the document's HTTP status."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        give_up = time.monotonic() + timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > give_up:
                raise AssertionError(f"{url} did not load in {timeout_s:.0f} s")
            self._receive()
        return self.statuses.get(url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        give_up = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > give_up:
                raise AssertionError(f"still falsy after {timeout_s:.0f} s: {expression}")
            time.sleep(0.5)

    def dom(self) -> str:
        """The document as it is now (what ``--dump-dom`` prints)."""
        return str(self.evaluate("document.documentElement.outerHTML"))

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        """Close the WebSocket."""
        with contextlib.suppress(Exception):
            self.ws.close()


def _devtools_port(proc: subprocess.Popen[bytes], stderr: Path, timeout_s: float) -> int:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", stderr.read_text("utf-8"))
        if found:
            return int(found.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"chromium gave no DevTools port:\n{stderr.read_text('utf-8')[-2000:]}")


@contextlib.contextmanager
def chromium(timeout_s: float = 60.0) -> Iterator[Page]:
    """A fresh headless Chromium and its first page; stopped (by PID) afterwards."""
    import requests
    from deployment import kill_tree

    exe = binary()
    with tempfile.TemporaryDirectory(prefix="qosflow-chromium-") as tmp:
        stderr = Path(tmp) / "stderr.log"
        with stderr.open("wb") as err:
            proc = subprocess.Popen(
                [
                    exe,
                    *FLAGS,
                    f"--user-data-dir={tmp}/profile",
                    "--remote-debugging-port=0",
                    "about:blank",
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        page: Page | None = None
        try:
            port = _devtools_port(proc, stderr, timeout_s)
            targets = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            page = Page(url)
            yield page
        finally:
            if page is not None:
                page.close()
            kill_tree(proc, grace_s=5.0)

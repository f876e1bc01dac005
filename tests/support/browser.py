"""Headless Chromium, driven over the DevTools protocol, for tests that look at a page as
a person does: open it, wait until its text says something, take a screenshot.

Bokeh draws every widget inside shadow roots, which ``chromium --dump-dom`` leaves out,
so :meth:`Browser.text` walks the rendered page, shadow roots included, and keeps the
text of visible elements. The protocol is spoken over tornado's websocket client
(tornado comes with distributed); the browser is the system's (Debian's ``chromium``
package): nothing is downloaded.

Neighbours: ``tests/observe/test_dashboard.py`` and :mod:`tests.support.screenshot`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient
from tornado.websocket import WebSocketClientConnection, websocket_connect

#: Where the browser is looked for, in order.
NAMES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",  # tests may run as root, in containers
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)

#: The text of the page as shown: text nodes of visible elements, shadow roots included.
TEXT_JS = """
(() => {
  const out = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) {
      const text = node.textContent.trim();
      if (text) out.push(text);
      return;
    }
    if (node.nodeType === Node.ELEMENT_NODE) {
      if (["SCRIPT", "STYLE", "TEMPLATE"].includes(node.tagName)) return;
      if (node.checkVisibility && !node.checkVisibility({contentVisibilityAuto: true}) && getComputedStyle(node).display !== "contents") return;
      if (node.shadowRoot) walk(node.shadowRoot);
    }
    for (const child of node.childNodes) walk(child);
  };
  walk(document);
  return out.join("\\n");
})()
"""


def find_chromium() -> str | None:
    """The path of the system's Chromium, or None."""
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


#: Where the innermost visible element with a given text is (its middle, in the
#: viewport), shadow roots included; null if none.
FIND_JS = """
((wanted) => {
  let best = null;
  const walk = (node) => {
    if (node.nodeType !== Node.ELEMENT_NODE && node.nodeType !== Node.DOCUMENT_FRAGMENT_NODE
        && node.nodeType !== Node.DOCUMENT_NODE) return;
    if (node.nodeType === Node.ELEMENT_NODE) {
      if (node.shadowRoot) walk(node.shadowRoot);
      if (node.textContent.trim() === wanted) {
        const r = node.getBoundingClientRect();
        if (r.width > 0 && r.height > 0) best = node;
      }
    }
    for (const child of node.childNodes) walk(child);
  };
  walk(document);
  if (best === null) return null;
  // Below the fold, a mouse event at its place would hit nothing: scroll it into view.
  best.scrollIntoView({block: "center"});
  const r = best.getBoundingClientRect();
  return {x: r.x + r.width / 2, y: r.y + r.height / 2};
})(%s)
"""


#: The text of each table cell whose content is cut (wider or taller than the cell shows),
#: shadow roots included.
CLIPPED_JS = """
(() => {
  const out = [];
  const walk = (node) => {
    if (node.nodeType === Node.ELEMENT_NODE) {
      if (node.shadowRoot) walk(node.shadowRoot);
      if (node.classList.contains("slick-cell") && node.getBoundingClientRect().width > 0
          && (node.scrollWidth > node.clientWidth + 1
              || node.scrollHeight > node.clientHeight + 1)) {
        out.push(node.textContent.trim());
      }
    }
    for (const child of node.childNodes) walk(child);
  };
  walk(document);
  return out;
})()
"""


class Browser:
    """One headless Chromium with one tab (``async with Browser() as b``)."""

    def __init__(self, width: int = 1400, height: int = 1000, timeout: float = 30):
        self.width, self.height, self.timeout = width, height, timeout
        #: Exceptions the page's scripts threw (``Runtime.exceptionThrown``).
        self.exceptions: list[str] = []
        #: What the page's scripts logged (``console.log`` and the like).
        self.console: list[str] = []
        self._ids = 0
        self._dir: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._ws: WebSocketClientConnection | None = None

    async def __aenter__(self) -> Browser:
        chromium = find_chromium()
        if chromium is None:
            raise RuntimeError(f"no Chromium found (looked for {', '.join(NAMES)})")
        self._dir = tempfile.mkdtemp(prefix="amm-rules-browser-")
        log = open(os.path.join(self._dir, "chromium.log"), "wb")  # noqa: SIM115
        self._process = subprocess.Popen(
            [
                chromium,
                *FLAGS,
                f"--user-data-dir={self._dir}/profile",
                f"--window-size={self.width},{self.height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()
        try:
            port = await self._port()
            self._ws = await websocket_connect(
                await self._page_socket(port), max_message_size=256 * 2**20
            )
            await self.send("Runtime.enable")
            await self.send("Page.enable")
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        if self._process is not None:
            self._process.terminate()
            try:
                await asyncio.to_thread(self._process.wait, 10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                await asyncio.to_thread(self._process.wait)
            self._process = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- the protocol ------------------------------------------------------------------

    async def _port(self) -> int:
        """The DevTools port, which Chromium writes into its profile once it listens."""
        assert self._dir is not None and self._process is not None
        path = Path(self._dir, "profile", "DevToolsActivePort")
        deadline = asyncio.get_running_loop().time() + self.timeout
        while not path.exists() or not path.read_text().strip():
            if self._process.poll() is not None:
                raise RuntimeError(f"Chromium exited ({self._process.returncode}): {self._log()}")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"Chromium did not open its DevTools port: {self._log()}")
            await asyncio.sleep(0.05)
        return int(path.read_text().split()[0])

    async def _page_socket(self, port: int) -> str:
        response = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}/json/list")
        pages = [t for t in json.loads(response.body) if t.get("type") == "page"]
        if not pages:
            raise RuntimeError("Chromium opened no tab")
        return pages[0]["webSocketDebuggerUrl"]

    def _log(self) -> str:
        assert self._dir is not None
        text = Path(self._dir, "chromium.log").read_text(errors="replace")
        return text[-2000:] or "(no output)"

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a DevTools method; its result (events that arrive meanwhile are kept
        when they are script exceptions, else dropped)."""
        assert self._ws is not None
        self._ids += 1
        ident = self._ids
        await self._ws.write_message(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            raw = await asyncio.wait_for(self._ws.read_message(), self.timeout)
            if raw is None:
                raise RuntimeError(f"Chromium closed the connection: {self._log()}")
            msg = json.loads(raw)
            if msg.get("method") == "Runtime.consoleAPICalled":
                args = msg["params"].get("args", [])
                self.console.append(
                    " ".join(str(a.get("value", a.get("description", ""))) for a in args)
                )
            if msg.get("method") == "Runtime.exceptionThrown":
                details = msg["params"]["exceptionDetails"]
                self.exceptions.append(
                    details.get("exception", {}).get("description") or details.get("text", "")
                )
            if msg.get("id") != ident:
                continue
            if "error" in msg:
                raise RuntimeError(f"{method}: {msg['error']}")
            return msg["result"]

    # -- what a test does ----------------------------------------------------------------

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def text(self) -> str:
        """The page's visible text, one text node per line."""
        result = await self.send("Runtime.evaluate", expression=TEXT_JS, returnByValue=True)
        return str(result["result"].get("value", ""))

    async def clipped(self) -> list[str]:
        """The text of each table cell that shows only part of it (a person reads the
        rest only by hovering, if at all)."""
        result = await self.send("Runtime.evaluate", expression=CLIPPED_JS, returnByValue=True)
        return list(result["result"].get("value") or [])

    async def wait_for_text(self, check: Callable[[str], bool], timeout: float = 30) -> str:
        """The page's text once ``check`` holds for it; fails after ``timeout`` seconds,
        showing the text last seen."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            text = await self.text()
            if check(text):
                return text
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"the page never showed what was expected; it shows:\n{text}")
            await asyncio.sleep(0.2)

    async def click_text(self, text: str) -> None:
        """Click, as a mouse does, the middle of the innermost visible element whose
        text is ``text`` (shadow roots included): a table cell, a button."""
        found = await self.send(
            "Runtime.evaluate", expression=FIND_JS % json.dumps(text), returnByValue=True
        )
        where = found["result"].get("value")
        if not where:
            raise AssertionError(f"nothing on the page reads {text!r}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=where["x"],
                y=where["y"],
                button="left",
                clickCount=1,
            )

    async def screenshot(self, path: str | os.PathLike[str], settle: float = 1.0) -> None:
        """The tab as a PNG image, its whole page: the viewport is first made as tall
        as the page, and the page given ``settle`` seconds to lay itself out again (a
        capture beyond the viewport would resize it while the picture is taken)."""
        metrics = await self.send("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        height = max(self.height, int(size["height"]))
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        await asyncio.sleep(settle)
        shot = await self.send("Page.captureScreenshot", format="png")
        await self.send("Emulation.clearDeviceMetricsOverride")
        Path(path).write_bytes(base64.b64decode(shot["data"]))

"""A real headless browser for the HTML report's test: Debian's chromium driven over the Chrome
DevTools Protocol on a pipe (`--remote-debugging-pipe`: fd 3 in, fd 4 out, NUL-separated JSON),
so no websocket library is needed. It records what a user's console would show (exceptions,
console errors, failed loads) and every request that is not the page itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, chromium: str, profile: Path, flags: tuple[str, ...] = ("--disable-gpu",)):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire():  # in the child: the protocol's fds 3 (commands) and 4 (replies)
            high_r, high_w = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self._proc = subprocess.Popen(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                *flags,
                "--no-first-run",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "--window-size=1300,1000",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire,
            pass_fds=(3, 4),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def _send(self, message: dict) -> int:
        self._next_id += 1
        message["id"] = self._next_id
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the protocol pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        message = {"method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        wanted = self._send(message)
        while True:
            reply = self._receive(30)
            if reply.get("id") == wanted:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def call(self, method: str, params: dict | None = None) -> dict:
        """A protocol command in the page's session."""
        return self._call(method, params, self._session)

    def open(self, path: Path) -> None:
        """Loads a file and waits for its load event; what an earlier page did is forgotten."""
        self.events.clear()
        self.call("Page.navigate", {"url": path.resolve().as_uri()})
        deadline = time.monotonic() + 30
        while not any(e["method"] == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not finish loading")
            event = self._receive(30)
            if "method" in event:
                self.events.append(event)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page; a thrown error fails loudly."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def problems(self) -> list[str]:
        """What the console shows as wrong: uncaught exceptions, console errors and warnings,
        log entries at error level, and failed loads."""
        found = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                found.append(f"exception: {p['exceptionDetails']}")
            elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "warning"):
                found.append(f"console.{p['type']}: {p['args']}")
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                found.append(f"log: {p['entry']['text']}")
            elif e["method"] == "Network.loadingFailed":
                found.append(f"failed load: {p}")
        return found

    def requests(self) -> list[str]:
        """Every URL the page asked for."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]

    def close(self) -> None:
        try:
            self._send({"method": "Browser.close"})
        except OSError:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)

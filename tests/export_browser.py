"""Drive Debian's headless Chromium through the DevTools protocol, with no extra package.

Chromium's ``--remote-debugging-pipe`` speaks the DevTools protocol over file
descriptors 3 (commands in) and 4 (replies and events out), each message a JSON
text ended by a NUL byte.  That needs neither a websocket client nor Playwright, so
the browser tests depend on nothing but the ``chromium`` package.

Every wait is bounded (a hung browser fails the test, it never hangs the suite);
none of the bounds measures how fast anything is.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
WAIT = 60.0  # seconds: a guard against a hung browser, not a performance bound


def find_chromium() -> Optional[str]:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    pass


def _high_fd(fd: int) -> int:
    """A copy of ``fd`` numbered 10 or more (the original is closed)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Browser:
    """One headless Chromium with one page, attached in flat session mode."""

    def __init__(self, executable: str, profile_dir: Optional[str] = None,
                 width: int = 1280, height: int = 860) -> None:
        self._own_profile = profile_dir is None
        self.profile_dir = profile_dir or tempfile.mkdtemp(prefix="stackshot-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # keep the child's ends clear of 3 and 4, so redirecting one cannot clobber the other
        cmd_r, out_w = (_high_fd(fd) for fd in (cmd_r, out_w))
        args = [
            executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
            f"--user-data-dir={self.profile_dir}", "--remote-debugging-pipe", "about:blank",
        ]
        # bash puts the pipe ends at the descriptor numbers Chromium expects, then execs
        # it (dash cannot: it reads only one-digit descriptor numbers)
        self.proc = subprocess.Popen(
            [shutil.which("bash") or "/bin/bash", "-c", f'exec "$@" 3<&{cmd_r} 4>&{out_w}', "bash", *args],
            pass_fds=(cmd_r, out_w), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._stderr: list[bytes] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._inbox: "queue.Queue[Optional[dict]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._next_id = 0
        self.events: list[dict] = []
        self.session: Optional[str] = None
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = self.call("Target.attachToTarget",
                             {"targetId": target["targetId"], "flatten": True}, session=False)
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": True,
                                           "flatten": True})
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    # -- plumbing -------------------------------------------------------------
    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _read(self) -> None:
        buf = b""
        with os.fdopen(self._out_r, "rb", buffering=0) as f:
            while True:
                chunk = f.read(65536)
                if not chunk:
                    self._inbox.put(None)
                    return
                buf += chunk
                while b"\0" in buf:
                    msg, buf = buf.split(b"\0", 1)
                    self._inbox.put(json.loads(msg))

    def _next(self) -> dict:
        try:
            msg = self._inbox.get(timeout=WAIT)
        except queue.Empty:
            raise BrowserError("chromium did not answer") from None
        if msg is None:
            err = b"".join(self._stderr[-20:]).decode(errors="replace")
            raise BrowserError(f"chromium closed its DevTools pipe; stderr:\n{err}")
        return msg

    def _send(self, msg: dict) -> None:
        try:
            os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            self.proc.wait(timeout=WAIT)
            err = b"".join(self._stderr[-20:]).decode(errors="replace")
            raise BrowserError(f"chromium exited ({self.proc.returncode}); stderr:\n{err}") from None

    def _post(self, method: str, params: dict, session: Optional[str]) -> int:
        """Send a command without waiting; its reply is skipped when it arrives."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self._send(msg)
        return self._next_id

    def call(self, method: str, params: Optional[dict] = None, *, session: Any = True) -> dict:
        """Send one command and return its result, keeping the events that arrive meanwhile.

        ``session``: True for the page, False for the browser, or a session id string.
        """
        sid = self.session if session is True else (session or None)
        my_id = self._post(method, params or {}, sid)
        while True:
            reply = self._next()
            if reply.get("id") == my_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def _event(self, msg: dict) -> None:
        if "method" not in msg:
            return
        self.events.append(msg)
        sid = msg.get("sessionId")
        if msg["method"] == "Page.javascriptDialogOpening":
            # a dialog would block the page; dismiss it, the test sees the event
            self._post("Page.handleJavaScriptDialog", {"accept": False}, sid)
        elif msg["method"] == "Target.attachedToTarget":
            # an out-of-process iframe (sandboxed frames are): watch it as we watch the
            # page, then let it start
            child = msg["params"]["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self._post(f"{domain}.enable", {}, child)
            self._post("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": True,
                                                "flatten": True}, child)
            self._post("Runtime.runIfWaitingForDebugger", {}, child)

    def wait_event(self, method: str) -> dict:
        for ev in self.events:
            if ev["method"] == method:
                return ev
        while True:
            msg = self._next()
            self._event(msg)
            if msg.get("method") == method:
                return msg

    # -- what tests use ---------------------------------------------------------
    def open(self, path: Path) -> None:
        """Load a file and wait for its load event."""
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()})
        self.wait_event("Page.loadEventFired")

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable results)."""
        return self._value(self.call("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True}), expression)

    def eval_in_child_frame(self, expression: str) -> Any:
        """Evaluate in the page's first iframe, in or out of the page's process."""
        self.eval("0")  # flush pending events
        tree = self.call("Page.getFrameTree")["frameTree"]
        local = [c["frame"]["id"] for c in tree.get("childFrames") or []]
        for ev in self.events:
            p = ev.get("params", {})
            if ev["method"] == "Target.attachedToTarget" and p["targetInfo"].get("type") == "iframe":
                return self._value(self.call("Runtime.evaluate", {
                    "expression": expression, "returnByValue": True}, session=p["sessionId"]), expression)
            aux = p.get("context", {}).get("auxData", {})
            if (ev["method"] == "Runtime.executionContextCreated" and local
                    and aux.get("frameId") == local[0] and aux.get("isDefault")):
                return self._value(self.call("Runtime.evaluate", {
                    "expression": expression, "contextId": p["context"]["id"],
                    "returnByValue": True}), expression)
        raise BrowserError("the page has no iframe with a script context")

    @staticmethod
    def _value(res: dict, expression: str) -> Any:
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression!r} threw: {res['exceptionDetails']}")
        return res["result"].get("value")

    def mouse(self, kind: str, x: float, y: float, **extra: Any) -> None:
        self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, **extra})

    def click(self, x: float, y: float) -> None:
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, button="left", clickCount=1)
        self.mouse("mouseReleased", x, y, button="left", clickCount=1)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, error log entries and dialogs so far."""
        self.eval("0")  # flush events that arrived before now
        out = []
        for ev in self.events:
            m, p = ev["method"], ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails']}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                out.append(f"console.{p['type']}: {p.get('args')}")
            elif m == "Log.entryAdded" and p["entry"].get("level") in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry'].get('text')}")
            elif m == "Page.javascriptDialogOpening":
                out.append(f"dialog: {p.get('message')}")
        return out

    def close(self) -> None:
        try:
            self.call("Browser.close", session=False)
        except BrowserError:
            pass
        try:
            self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        if self._own_profile:
            shutil.rmtree(self.profile_dir, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

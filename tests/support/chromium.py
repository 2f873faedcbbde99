"""Headless Chromium for tests of pages (the report): importable from any test, no pytest here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def chromium_dom(page: Path, profile: Path, *, window: str = "") -> str:
    """The page's DOM after its scripts ran, as headless Chromium sees it (no network: a file URL,
    and every background service off), in a window of `window` ("1200,900") if given."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe is not None, "chromium is not installed (scripts/test.sh installs it)"
    done = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
         "--no-first-run", "--no-pings", "--disable-breakpad", f"--user-data-dir={profile}",
         *([f"--window-size={window}"] if window else []), "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Page:
    """A page open in headless Chromium, driven over the DevTools protocol on a pipe (Chromium's
    `--remote-debugging-pipe`: commands on its fd 3, answers on its fd 4, each JSON message ended by
    a NUL byte): no websocket client, no port. `evaluate(js)` answers the expression's value; the
    page stays open (its scripts, its event streams) until `close()`."""

    def __init__(self, url: str, profile: Path) -> None:
        import json
        import os

        self._json = json
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        assert exe is not None, "chromium is not installed (scripts/test.sh installs it)"
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
                 "--no-first-run", "--no-pings", "--disable-breakpad", f"--user-data-dir={profile}",
                 "--remote-debugging-pipe", "about:blank"]

        def onto_3_and_4() -> None:  # in the child: the pipe ends where Chromium looks for them
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)  # copies first: either may be 3 or 4 now
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._proc = subprocess.Popen([exe, *flags], preexec_fn=onto_3_and_4, close_fds=False,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._id = 0
        target = self._call("Target.createTarget", {"url": url})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def _call(self, method: str, params: dict[str, object], session: str | None = None) -> dict[str, object]:
        import os

        self._id += 1
        message: dict[str, object] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, self._json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                import select

                ready, _, _ = select.select([self._from_chrome], [], [], 60)
                assert ready, f"chromium did not answer {method} within 60 s"
                chunk = os.read(self._from_chrome, 65536)
                assert chunk, "chromium closed its DevTools pipe"
                self._buffer += chunk
            raw, _, self._buffer = self._buffer.partition(b"\0")
            answer = self._json.loads(raw)
            if answer.get("id") == self._id:
                assert "error" not in answer, answer["error"]
                return dict(answer.get("result", {}))

    def evaluate(self, expression: str) -> object:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                 "awaitPromise": True}, self._session)
        value = result.get("result", {})
        assert isinstance(value, dict)
        return value.get("value")

    def close(self) -> None:
        import os

        self._proc.kill()
        self._proc.wait(30)
        os.close(self._to_chrome)
        os.close(self._from_chrome)

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

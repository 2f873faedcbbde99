"""One redactor that knows every secret value this process was given, and masks it in any text.

A name that looks secret (`*_KEY`, `TOKEN`, ...) is not enough: a provider may echo its request's
headers in an error body, a `GITHUB_PAT` or a `DATABASE_URL` password has no such name. So the
values themselves are registered where they enter (a provider client's headers, a cloud's secret
settings, a job's environment that is not public, a ledger URL's password), and every text that
leaves towards a person or a file goes through `redact`: our exceptions' messages
(failures.ActorRunError), a provider's error body (clouds/http.py `short`), the log sinks.

    add_secret("rp_abc123456")          # from now on masked everywhere in this process
    redact("HTTP 401: bad key rp_abc123456")  == "HTTP 401: bad key <redacted>"

Values shorter than `MIN_LENGTH` are not registered: masking every "1" or "true" would blind the
logs, and such a value is no secret. Registration only grows (a process's secrets stay secret).
"""

from __future__ import annotations

import re
import threading
from urllib.parse import urlsplit

MIN_LENGTH = 6
REDACTED = "<redacted>"


class Redactor:
    """A set of secret values and one regex that finds any of them (longest first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add(self, *values: str) -> None:
        """Register values; `Bearer <token>` and other values with spaces register their parts too."""
        new = set()
        for value in values:
            for v in (value, *value.split()):
                v = v.strip()
                if len(v) >= MIN_LENGTH and v not in self._values and v != REDACTED:
                    new.add(v)
        if not new:
            return
        with self._lock:
            self._values |= new
            ordered = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(v) for v in ordered))

    def redact(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not text:
            return text
        return pattern.sub(REDACTED, text)

    def __contains__(self, value: str) -> bool:
        return value in self._values


SECRETS = Redactor()


def add_secret(*values: str) -> None:
    SECRETS.add(*values)


def redact(text: str) -> str:
    return SECRETS.redact(text)


def add_url_password(url: str) -> None:
    """The password of a URL (`postgresql://user:pw@host/db`), if it has one."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return
    if password:
        SECRETS.add(password)

"""One redactor that knows every secret value this process was given, and masks it in any text.

A name that looks secret (`*_KEY`, `TOKEN`, ...) is not enough: a provider may echo its request's
headers in an error body, a `GITHUB_PAT` or a `DATABASE_URL` password has no such name. So the
values themselves are registered where they enter (a provider client's headers, a cloud's secret
settings, a job's environment that is not public, a ledger URL's password), and every text that
leaves towards a person or a file goes through `redact`: our exceptions' messages
(failures.ActorRunError), a provider's error body (clouds/http.py `short`), the log sinks.

    add_secret("rp_abc123456")          # from now on masked everywhere in this process
    redact("HTTP 401: bad key rp_abc123456")  == "HTTP 401: bad key <redacted>"

A secret reaches a log in other spellings too: a provider's error body may hold it URL-encoded
(`a%2Fb`), JSON-escaped (`a\\/b`, `\\u00e9`) or inside base64 (`Basic dXNlcjprZXk=`), or cut (the
first 12 characters "for reference"). Each registered value is masked in every one of those forms:
its URL encodings, its JSON escapes, the base64 runs that spell it whatever its offset in the
encoded bytes, and, for a value of `PART_FROM` characters or more, any prefix or suffix of at least
`PART_LENGTH` characters.

Values shorter than `MIN_LENGTH` are not registered: masking every "1" or "true" would blind the
logs, and such a value is no secret. Registration only grows (a process's secrets stay secret).
A provider key shorter than `MIN_KEY_LENGTH` is refused as a key (rented.py `api_key`).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from urllib.parse import quote, quote_plus, urlsplit

MIN_LENGTH = 6
MIN_KEY_LENGTH = 8  # a provider API key shorter than this is refused (no real provider issues one)
PART_FROM, PART_LENGTH = 16, 8  # a value this long is masked in any prefix or suffix this long too
REDACTED = "<redacted>"


def _base64_runs(value: bytes) -> set[str]:
    """The runs of base64 characters that spell `value` wherever it starts in the encoded bytes
    (three offsets), standard and URL-safe: only characters every bit of which is the value's."""
    runs = set()
    n = len(value)
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + value).decode()
        start, end = -(-8 * shift // 6), (8 * shift + 8 * n) // 6
        run = encoded[start:end]
        if len(run) >= MIN_LENGTH:
            runs |= {run, run.replace("+", "-").replace("/", "_")}
    return runs


def spellings(value: str) -> set[str]:
    """`value` as a log may hold it: itself, URL-encoded, JSON-escaped, inside base64."""
    forms = {value, quote(value, safe=""), quote(value), quote_plus(value),
             json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    forms |= {f.replace("/", "\\/") for f in list(forms)}  # JSON may escape '/' too
    forms |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), f) for f in forms if "%" in f}
    forms |= _base64_runs(value.encode())
    return {f for f in forms if len(f) >= MIN_LENGTH}


def _parts(value: str) -> str:
    """A regex for any prefix or any suffix of `value` at least PART_LENGTH long (longest first)."""
    prefix = ""
    for ch in reversed(value[PART_LENGTH:]):
        prefix = f"(?:{re.escape(ch)}{prefix})?"
    suffix = ""
    for ch in value[:-PART_LENGTH]:
        suffix = f"(?:{suffix}{re.escape(ch)})?"
    return f"{re.escape(value[:PART_LENGTH])}{prefix}|{suffix}{re.escape(value[-PART_LENGTH:])}"


class Redactor:
    """A set of secret values and one regex that finds any of them (longest first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._forms: set[str] = set()  # every spelling of every value (`spellings`)
        self._parts: list[str] = []  # the prefix-or-suffix regexes of the long values
        self._pattern: re.Pattern[str] | None = None
        self._parts_pattern: re.Pattern[str] | None = None  # applied after the whole spellings

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
            for v in new:
                self._forms |= spellings(v)
                if len(v) >= PART_FROM and not any(ch.isspace() for ch in v):  # `Bearer x`: its parts are values
                    self._parts.append(_parts(v))
            ordered = sorted(self._forms, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(v) for v in ordered))
            # a second pass: a cut value (a prefix, a suffix) in what the whole spellings left
            self._parts_pattern = re.compile("|".join(self._parts)) if self._parts else None

    def redact(self, text: str) -> str:
        pattern, parts = self._pattern, self._parts_pattern
        if pattern is None or not text:
            return text
        text = pattern.sub(REDACTED, text)
        return parts.sub(REDACTED, text) if parts is not None else text

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

"""protocols/redact.py: a secret is masked by its value, wherever it appears."""

from __future__ import annotations

import httpx

from actor_run.protocols.clouds.http import ProviderAPI, short
from actor_run.protocols.failures import LaunchRefused
from actor_run.protocols.redact import REDACTED, Redactor, add_secret, add_url_password, redact
from actor_run.protocols.specs import Job, redacted


def test_values_are_masked_longest_first_and_short_ones_are_not_secrets() -> None:
    r = Redactor()
    r.add("Bearer abcdef123456", "abc", "abcdef123456789")
    assert r.redact("key abcdef123456789 and abcdef123456") == f"key {REDACTED} and {REDACTED}"
    assert r.redact("abc is no secret") == "abc is no secret"


def test_a_providers_echo_of_its_headers_is_masked() -> None:
    key = "rp_echoed_key_0123456789"
    ProviderAPI("x", "http://127.0.0.1:9", {"Authorization": f"Bearer {key}"})  # registers its headers
    request = httpx.Request("POST", "http://x/v2/pods", headers={"Authorization": f"Bearer {key}"})
    echo = httpx.Response(401, json={"headers": {"authorization": f"Bearer {key}"}}, request=request)
    text = short(echo)
    assert key not in text
    assert text.startswith("HTTP 401")
    assert key not in str(LaunchRefused(f"refused: {echo.text}"))  # and any exception of ours made from it


def test_env_values_are_masked_in_the_ledger_unless_public_and_everywhere_else() -> None:
    job = Job(name="t", command="echo", seed=1, env={"GITHUB_PAT": "ghp_0123456789abcdef", "MODE": "fast-mode"},
              public_env=["MODE"])
    kept = redacted(job)
    assert kept.env == {"GITHUB_PAT": REDACTED, "MODE": "fast-mode"}
    assert redact("cloning with ghp_0123456789abcdef") == f"cloning with {REDACTED}"


def test_a_database_urls_password() -> None:
    add_url_password("postgresql://team:s3cret-pass-word@db.example/ledger")
    assert "s3cret-pass-word" not in redact("connect failed for team:s3cret-pass-word@db")
    add_secret("")  # nothing to register


def test_a_value_is_masked_in_every_spelling_a_log_can_hold() -> None:
    import base64
    import json
    from urllib.parse import quote, quote_plus

    key = 'rp_live/0123+4567"89abcdef=='
    r = Redactor()
    r.add(key)
    spellings = [key, quote(key, safe=""), quote(key), quote_plus(key), json.dumps(key)[1:-1],
                 json.dumps(key)[1:-1].replace("/", "\\/"), quote(key, safe="").lower()]
    for prefix in (b"", b"u", b"us", b"user:"):  # base64 of the key at every offset in the encoded bytes
        encoded = base64.b64encode(prefix + key.encode() + b"!").decode()
        spellings += [encoded, encoded.replace("+", "-").replace("/", "_")]
    for text in spellings:
        masked = r.redact(f"error: {text} end")
        assert REDACTED in masked, text
        for cut in (key[:8], key[-8:]):
            assert cut not in masked, (text, masked)
    assert r.redact(f"see {key[:10]}... for the key") == f"see {REDACTED}... for the key"  # a prefix of it
    assert r.redact(f"ends in ...{key[-9:]}") == f"ends in ...{REDACTED}"  # a suffix of it
    assert r.redact("rp_live") == "rp_live"  # fewer than 8 characters of it: no telling it apart

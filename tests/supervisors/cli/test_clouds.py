"""`actor-run clouds check` against each fake provider: read-only calls only, what it finds, and
the variable to set when the key is missing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.batch_kit import cli, client_key, write_batch
from fakes.providers import FAKES, serve


@pytest.fixture(params=sorted(FAKES))
def fake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield from serve(request.param, tmp_path)


def test_check_reads_only_and_says_what_it_found(tmp_path: Path, fake: Any) -> None:
    fake.no_stock(fake.GPUS[0])
    batch = write_batch(tmp_path, fake.CLOUD, fake.url, gpus=list(fake.GPUS), seeds=[1], settings=fake.settings())
    done = cli(tmp_path, "clouds", "check", "--batch", str(batch), key_var=fake.KEY_VAR)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the key works; 0 machine(s) of ours alive" in done.stdout
    assert f"{fake.GPUS[0]}: out of stock" in done.stdout
    assert f"{fake.GPUS[1]}: in stock in" in done.stdout
    # nothing made, nothing changed (Vast's offer search is a POST that reads: its fake names it)
    assert {(m, t) for m, t, _ in fake.calls if m != "GET"} <= set(getattr(fake, "SEARCHES", ()))
    # a key of a real length (under 8 characters is refused as a key)
    refused = cli(tmp_path, "clouds", "check", "--batch", str(batch), key_var=fake.KEY_VAR, key="wrong-key-0123")
    assert refused.returncode == 1
    assert "the key was refused" in refused.stdout
    assert "wrong" not in refused.stdout + refused.stderr


def test_check_without_a_key_names_the_variable(tmp_path: Path) -> None:
    done = cli(tmp_path, "clouds", "check", "lambda", key_var="UNRELATED")
    assert done.returncode == 2
    assert "set the environment variable LAMBDA_API_KEY" in done.stdout


def test_check_reads_the_settings_from_the_user_config(tmp_path: Path) -> None:
    name = sorted(FAKES)[0]
    server = FAKES[name](tmp_path / "fake").start()
    try:
        user = tmp_path / "user.toml"
        # the provider's address and our key live in the user's settings; no batch names them
        key = client_key(tmp_path / "keys")
        user.write_text(f'[clouds.{server.CLOUD}]\napi_url = "{server.url}"\nssh_key = "{key}"\n')
        done = cli(tmp_path, "clouds", "check", server.CLOUD, "--config", str(user), key_var=server.KEY_VAR)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "the key works; 0 machine(s) of ours alive" in done.stdout
    finally:
        server.stop()
    assert server.violations == []

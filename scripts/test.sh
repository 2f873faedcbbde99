#!/bin/sh
# The whole test suite on a fresh Debian machine: installs what the tests need (OpenSSH server,
# rsync, Chromium (for the report's page), PostgreSQL and zsh (for the completion test) through apt
# when missing; the package and its test extras in .venv), then runs ruff, mypy and pytest. The
# tests start their own sshd and their own throwaway PostgreSQL cluster (tests/support/pg.py).
set -eu
cd "$(dirname "$0")/.."
need=""
[ -x /usr/sbin/sshd ] || need="$need openssh-server"
command -v rsync >/dev/null 2>&1 || need="$need rsync"
command -v ssh >/dev/null 2>&1 || need="$need openssh-client"
command -v ps >/dev/null 2>&1 || need="$need procps"
command -v chromium >/dev/null 2>&1 || need="$need chromium"  # opens `actor-run report`'s page in a test
# Debian keeps initdb and pg_ctl in /usr/lib/postgresql/<version>/bin, off PATH (tests/support/pg.py looks there)
command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need="$need postgresql"
command -v zsh >/dev/null 2>&1 || need="$need zsh"  # the zsh completion script is run by a test
if [ -n "$need" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $need >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  # Debian's own python3 makes venvs only with python3-venv installed
  python3 -m venv .venv 2>/dev/null || {
    rm -rf .venv
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv .venv
  }
fi
# installed once per pyproject.toml and install mode: a stamp in .venv says which (pip's own cache keeps the
# downloads). Editable in compat mode: a .pth file puts the repository on sys.path (actor_run/ links to the
# packages), where setuptools' default mode installs an import finder that every Python process of the venv
# loads at start-up (pathlib, re, urllib, importlib.util: about 25 ms of CPU each, hundreds of processes
# a suite); the tests put the repository on sys.path themselves (tests/conftest.py)
stamp="$(cat pyproject.toml | cksum) editable_mode=compat"
if [ "$(cat .venv/.installed 2>/dev/null)" != "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q -e '.[test]' --config-settings editable_mode=compat
  echo "$stamp" > .venv/.installed
fi
# SkyPilot itself, for the tests that run its own parser and outputs (tests/support/sky_own.py): pinned, in a venv of
# its own (its dependencies are heavy: about 460 MB, 5-7 minutes to install on a loaded 2-core machine),
# made once and reused while its pin matches
SKY_PIN="skypilot==0.14.1"
if [ "$(cat .venv-sky/pin 2>/dev/null)" != "$SKY_PIN" ]; then
  rm -rf .venv-sky
  python3 -m venv .venv-sky
  .venv-sky/bin/python -m pip install -q "$SKY_PIN"
  echo "$SKY_PIN" > .venv-sky/pin
fi
export ACTOR_RUN_SKY_PYTHON="$PWD/.venv-sky/bin/python"
# Prefect 3 itself, for the test that runs a flow embedding the Runner (tests/test_prefect.py): pinned, in a
# venv of its own with this repository installed into it (editable, compat mode: the same sources), made
# once per pin and pyproject.toml
PREFECT_PIN="prefect==3.9.1"
prefect_stamp="$PREFECT_PIN $(cat pyproject.toml | cksum)"
if [ "$(cat .venv-prefect/pin 2>/dev/null)" != "$prefect_stamp" ]; then
  rm -rf .venv-prefect
  python3 -m venv .venv-prefect
  .venv-prefect/bin/python -m pip install -q "$PREFECT_PIN"
  .venv-prefect/bin/python -m pip install -q -e . --config-settings editable_mode=compat
  echo "$prefect_stamp" > .venv-prefect/pin
fi
export ACTOR_RUN_PREFECT_PYTHON="$PWD/.venv-prefect/bin/python"
# Vast.ai's own CLI, pointed at the project's Vast fake by a test (tests/protocols/clouds/test_vastai_own.py:
# the fake speaks what Vast's own client expects): pinned, in a venv of its own, made once
VAST_PIN="vastai==1.9.1"
if [ "$(cat .venv-vast/pin 2>/dev/null)" != "$VAST_PIN" ]; then
  rm -rf .venv-vast
  python3 -m venv .venv-vast
  .venv-vast/bin/python -m pip install -q "$VAST_PIN"
  echo "$VAST_PIN" > .venv-vast/pin
fi
export ACTOR_RUN_VAST_PYTHON="$PWD/.venv-vast/bin/python"
# the suite starts hundreds of Python processes (`actor-run` commands, fakes' workers): the first
# writes the package's compiled bytecode and the others read it, even where the environment says not
# to write it (with PYTHONDONTWRITEBYTECODE every process compiled every module: 0.25 s of CPU each)
unset PYTHONDONTWRITEBYTECODE
# lint and types first (the test extra brings ruff, mypy and stubs): CI fails on either
.venv/bin/ruff check .
.venv/bin/mypy
# tests are independent and partly wait (sshd, HTTP fakes, subprocesses): six workers keep two cores
# busy (four left a fifth of them idle: 7 min 2 s against 6 min 7 s), each test given to whichever
# worker is free; the slowest 15 are named at the end of every run
workers=${ACTOR_RUN_TEST_WORKERS:-6}
PATH="$PWD/.venv/bin:$PATH" exec .venv/bin/python -m pytest -q -n "$workers" --dist worksteal --durations=15 "$@"

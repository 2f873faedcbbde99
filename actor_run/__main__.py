"""`python -m actor_run` is the `actor-run` command."""

from actor_run.supervisors.cli import entry

entry()

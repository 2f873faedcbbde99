"""The command line, `actor-run`: thin (it parses, builds specs, calls the Runner, renders).

    main.py        the parser (every command registered in one place), main(), entry()
    console.py     what the commands share: exit codes, logging, Ctrl-C, the live watch
    completion.py  bash and zsh completion scripts, made from the parser
    batch_file.py  loading the batch a command works on (a file, flags over it, or flags alone):
                   every command that reads a batch reads it here
    run.py, runs.py (runs and status), sweep.py, resume.py, cost.py, logs.py, report.py,
    clouds.py, worker.py (a shared PostgreSQL ledger), config.py: one module per command, each
    with its parser and its body; detach.py: `run --detach`, the controller in the background

What it may import: everything below it (protocols, actors, the supervision tree, the ledger,
the views). Nothing outside this package imports it (pyproject's script names `entry`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actor_run.protocols import lazy

if TYPE_CHECKING:
    from actor_run.supervisors.cli.console import Exit
    from actor_run.supervisors.cli.main import main
else:  # the commands load inside `entry`'s guard (a Ctrl-C during their 0.3 s of imports is one line)
    __getattr__, __dir__ = lazy.exports(globals(), {"Exit": "actor_run.supervisors.cli.console",
                                                    "main": "actor_run.supervisors.cli.main"})


def entry() -> None:
    """The `actor-run` console script (main.py's `entry`), its imports inside a Ctrl-C guard: a
    Ctrl-C while they run is one line and exit 130, never a traceback."""
    try:
        from actor_run.supervisors.cli.main import entry as run_command
    except KeyboardInterrupt:
        import sys

        sys.stderr.write("actor-run: interrupted\n")
        raise SystemExit(130) from None
    run_command()


__all__ = ["Exit", "entry", "main"]

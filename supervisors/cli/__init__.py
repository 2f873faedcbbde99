"""The command line, `actor-run`: thin (it parses, builds specs, calls the Runner, renders).

    main.py        the parser (every command registered in one place), main(), entry()
    console.py     what the commands share: exit codes, logging, Ctrl-C, the live watch
    completion.py  bash and zsh completion scripts, made from the parser
    batch_file.py  loading the batch a command works on (a file, flags over it, or flags alone):
                   every command that reads a batch reads it here
    run.py, runs.py (runs and status), sweep.py, resume.py, cost.py, logs.py, report.py,
    clouds.py, worker.py (a shared PostgreSQL ledger), config.py: one module per command, each
    with its parser and its body

What it may import: everything below it (protocols, actors, the supervision tree, the ledger,
the views). Nothing outside this package imports it (pyproject's script names `entry`).
"""

from actor_run.supervisors.cli.console import Exit
from actor_run.supervisors.cli.main import entry, main

__all__ = ["Exit", "entry", "main"]

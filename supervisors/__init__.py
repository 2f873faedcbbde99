"""The controller side of actor-run: its parts, one subpackage each (no module lives loose here).

    supervisors/tree/     the supervision tree: batch and job supervisors, the seed's end, and the
                          decisions they ask (policy, walk, offers, budget, restart intensity)
    supervisors/api/      the embedding API: Runner, JobHandle, the event bus, takeover (resume,
                          sweep), the job checks, places, the user's settings
    supervisors/ledger/   the durable record (SQLite, or PostgreSQL shared by workers): writer,
                          reader, backends, schema steps, the sweep's and resume's decisions
    supervisors/views/    what a person looks at: the live view, the run's page, the run's log
    supervisors/cli/      the `actor-run` command: the parser, one module per command

Floors, each importing only those below it (tests/test_layers.py checks them, type-checking imports
included): ledger <- tree <- api <- cli; views stand on the tree's plain data. The ledger imports
none of the others; the tree none of api, views, cli; the api no view and no command line; the
views no ledger backend, no api, no command line; nothing but the command line (and
`python -m actor_run`) imports the command line.
"""

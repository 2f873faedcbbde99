"""The supervision tree and what stands around it: the controller side of actor-run.

    supervisors/          the tree: runner.py (Runner: the embedding API; job_checks.py its checks
                          of a job and the clouds they build), handle.py (JobHandle),
                          places.py (state folder, results folder), batch.py (BatchSupervisor),
                          job.py (JobSupervisor), seed_end.py (what a job leaves in its folder),
                          supervisor.py (the OTP-style supervisor),
                          takeover.py (resume, sweep), walk.py, policy.py, budget.py,
                          reservations.py, offers.py, config.py (user settings), gc_tuning.py
    supervisors/ledger/   the durable record (SQLite, or PostgreSQL shared by workers): writer,
                          reader, backends, schema steps, the sweep's and resume's decisions
    supervisors/views/    what a person looks at: the live view, the run's page, the run's log
    supervisors/cli/      the `actor-run` command: the parser, one module per command

What may import what (tests/test_layers.py checks it): this layer imports protocols and actors,
never the other way. The ledger imports none of the tree, the views or the command line; the
views import the tree's plain data but no ledger backend and no command line; nothing but the
command line (and `python -m actor_run`) imports the command line.
"""

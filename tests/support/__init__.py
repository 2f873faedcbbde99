"""What the tests stand on that is not a fake provider (those are in tests/fakes/): a real sshd
(sshd.py) and PostgreSQL (pg.py), `actor-run` in the test's process (cli_inproc.py), bounded waits
(waits.py), the Runner fixtures (runner_kit.py), a real controller to kill (controller_kit.py),
a child's output read line by line, a sleeping batch and the processes its jobs left
(process_kit.py), `actor-run` on a pseudo-terminal (terminal.py), headless Chromium (chromium.py), SkyPilot's own code
(sky_own.py, run in SkyPilot's interpreter), Vast's own CLI in one process of its venv
(vast_own.py) and the suite's order under xdist (schedule.py)."""

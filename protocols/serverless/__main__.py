"""`python -m actor_run.protocols.serverless [--once]`: the worker's entry point (handler.main)."""

from actor_run.protocols.serverless.handler import main

raise SystemExit(main())

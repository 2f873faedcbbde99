"""`python -m actor_run.protocols.serverless [runpod's --rp_* flags]`: the worker's entry point (handler.main)."""

from actor_run.protocols.serverless.handler import main

raise SystemExit(main())

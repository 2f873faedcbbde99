"""moto's server on loopback for tests (ThreadedMotoServer on 127.0.0.1:<free port>): one per test
process, started by the session fixture `moto` (tests/conftest.py) the first time a test asks for
it, stopped when the session ends. moto_ec2.MotoEc2 and moto_s3.MotoS3 are a test's view of it: each
resets it when it starts and when it stops, so a test sees only what it made.

One server, not one per test module: moto's backends are one per process anyway (shared by every
server in it), and each new server builds its Flask app per service again, reading botocore's model
of the service (EC2's is megabytes of JSON): a tenth of a test worker's CPU when every module, and
every test of S3, started its own."""

from __future__ import annotations

import os
import threading
import urllib.request
from typing import Any, Self

from support.sshd import free_port


def share_botocore_data() -> None:
    """botocore's data files (EC2's model: megabytes of gzipped JSON; the endpoints) read once per
    test process, not once per botocore session. moto makes a session for each list of regions it
    builds, and every reset drops its backends, so EC2's model was decompressed and parsed again in
    each test (py-spy: a sixth of a moto test worker's CPU). botocore already hands one loaded dict to
    every client of a session, read only; this shares it between sessions too."""
    from botocore import loaders

    load_file = loaders.JSONFileLoader.load_file
    if getattr(load_file, "shared", False):
        return
    loaded: dict[str, Any] = {}
    lock = threading.Lock()

    def shared(self: Any, file_path: str) -> Any:
        with lock:
            if file_path not in loaded:
                loaded[file_path] = load_file(self, file_path)
            return loaded[file_path]

    shared.shared = True  # type: ignore[attr-defined]
    loaders.JSONFileLoader.load_file = shared  # type: ignore[method-assign]


class MotoServer:
    """The process's server: `endpoint`, `reset()`, `stop()`."""

    def __init__(self) -> None:
        # each reset drops every backend, and EC2's is built again per region at its next call: by default
        # with every public AMI of that region read from moto's JSON (py-spy: `_load_amis` and the dates it
        # parses were 3-4 % of a test worker's samples). Nothing here looks an AMI up: the fake `sky` runs
        # its instances from a made-up one, which moto does not check (MOTO_ENABLE_AMI_VALIDATION unset)
        os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"
        share_botocore_data()
        from moto.server import ThreadedMotoServer  # moto and boto3: 0.85 s of import, for the tests that use it

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.reset()

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"),
                               timeout=30).close()

    def stop(self) -> None:
        try:
            self.reset()
        finally:
            self.server.stop()


class MotoView:
    """A test's use of the process's server: reset at the start and at the end."""

    def __init__(self, server: MotoServer) -> None:
        self.shared = server
        self.endpoint = server.endpoint
        server.reset()

    def reset(self) -> None:
        self.shared.reset()

    def stop(self) -> None:
        self.shared.reset()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

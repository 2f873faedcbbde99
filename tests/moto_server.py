"""A moto server on loopback for tests (ThreadedMotoServer on 127.0.0.1:<free port>): started,
reset between uses, stopped. moto_ec2.MotoEc2 and moto_s3.MotoS3 add what their tests ask of it."""

from __future__ import annotations

import urllib.request
from typing import Self

from sshd import free_port


class MotoServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        from moto.server import ThreadedMotoServer  # moto and boto3: 0.85 s of import, for the tests that start one

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.reset()  # moto's backends are one per process, shared by every server in it

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"),
                               timeout=30).close()

    def stop(self) -> None:
        try:
            self.reset()
        finally:
            self.server.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

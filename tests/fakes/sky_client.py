"""`sky` of the fake SkyPilot (tests/fakes/sky.py): a thin client of its API server, as SkyPilot's
own CLI is of its server. It sends its argv as one JSON line to the server at $FAKE_SKY_API
(127.0.0.1:<port>) and prints the answer: stdout, stderr, exit code. Standard library only, run
with `-I -S`: a call costs an interpreter's start and one loopback connection."""

import json
import os
import socket
import sys


def main() -> int:
    host, _, port = os.environ["FAKE_SKY_API"].rpartition(":")
    try:
        conn = socket.create_connection((host, int(port)))
    except OSError as exc:  # SkyPilot's words when its server is not there
        print(f"sky.exceptions.ApiServerConnectionError: Could not connect to SkyPilot API server at "
              f"http://{host}:{port}. ({exc})", file=sys.stderr)
        return 1
    with conn:
        conn.sendall(json.dumps({"argv": sys.argv[1:]}).encode() + b"\n")
        with conn.makefile("rb") as f:
            line = f.readline()
    if not line:
        print("fake sky: the API server closed the connection without an answer", file=sys.stderr)
        return 1
    reply = json.loads(line)
    sys.stdout.buffer.write(reply["out"].encode())
    sys.stdout.flush()
    sys.stderr.buffer.write(reply["err"].encode())
    sys.stderr.flush()
    return int(reply["code"])


if __name__ == "__main__":
    sys.exit(main())

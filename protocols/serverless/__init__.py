"""Serverless workers: the payload a queue job carries and the handler a serverless image runs."""

from actor_run.protocols.serverless.handler import JobExited, handle, run
from actor_run.protocols.serverless.payload import (
    INLINE_LIMIT,
    PAYLOAD_LIMIT,
    PayloadError,
    decode_blob,
    encode_blob,
    pack,
    tar_folder,
    unpack,
)

__all__ = [
    "INLINE_LIMIT",
    "PAYLOAD_LIMIT",
    "JobExited",
    "PayloadError",
    "decode_blob",
    "encode_blob",
    "handle",
    "pack",
    "run",
    "tar_folder",
    "unpack",
]

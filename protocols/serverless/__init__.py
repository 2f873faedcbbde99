"""Serverless workers: the payload a queue job carries and the handler a serverless image runs."""

from actor_run.protocols.serverless.handler import JobExited, handle, run
from actor_run.protocols.serverless.payload import (
    INLINE_LIMIT,
    INPUT_ERROR,
    PAYLOAD_LIMIT,
    InputError,
    PayloadError,
    decode_blob,
    encode_blob,
    pack,
    tar_folder,
    unpack,
    url_blob,
)

__all__ = [
    "INLINE_LIMIT",
    "INPUT_ERROR",
    "PAYLOAD_LIMIT",
    "InputError",
    "JobExited",
    "PayloadError",
    "decode_blob",
    "encode_blob",
    "handle",
    "pack",
    "run",
    "tar_folder",
    "unpack",
    "url_blob",
]

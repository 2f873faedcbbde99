"""Serverless workers: the payload a queue job carries and the handler a serverless image runs."""

from actor_run.protocols.serverless.handler import handle, run
from actor_run.protocols.serverless.payload import (
    CHUNK_LIMIT,
    INLINE_LIMIT,
    INPUT_ERROR,
    OUT_INLINE_LIMIT,
    PAYLOAD_LIMIT,
    PREEMPTED_ERROR,
    TRANSFER_ERROR,
    InputError,
    PayloadError,
    decode_blob,
    encode_blob,
    pack,
    tar_folder,
    unpack,
    url_blob,
    worker_error,
)

__all__ = [
    "CHUNK_LIMIT",
    "INLINE_LIMIT",
    "INPUT_ERROR",
    "OUT_INLINE_LIMIT",
    "PAYLOAD_LIMIT",
    "PREEMPTED_ERROR",
    "TRANSFER_ERROR",
    "InputError",
    "PayloadError",
    "decode_blob",
    "encode_blob",
    "handle",
    "pack",
    "run",
    "tar_folder",
    "unpack",
    "url_blob",
    "worker_error",
]

"""An S3-compatible object store the user names, for archives too large to ride inline in a request.

The controller puts an archive once under its sha256 (`<prefix><sha256>.tar.gz`; an object already
there with the same size is taken as it is: the worker checks the hash anyway) and hands the worker
a presigned GET URL, never the keys: the worker downloads with the standard library and needs no
credentials. The keys are read from the environment variables the settings name, at first use,
and live only in the boto3 client.
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Any

import msgspec

from actor_run.protocols.failures import Code, Refused, SpecError, Unreachable
from actor_run.protocols.offload import to_thread

EXTRA = "actor-run[s3]"
MAX_EXPIRY_S = 7 * 24 * 3600  # the longest a SigV4 presigned URL may live


class ObjectStoreSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    url: str  # the store's endpoint, e.g. https://s3.us-east-1.amazonaws.com or an R2/MinIO URL
    bucket: str
    access_key_env: str = "AWS_ACCESS_KEY_ID"  # the NAMES of the variables holding the keys
    secret_key_env: str = "AWS_SECRET_ACCESS_KEY"
    region: str = "us-east-1"
    prefix: str = "actor-run/"
    expiry_s: Annotated[int, msgspec.Meta(ge=60, le=MAX_EXPIRY_S)] = 6 * 3600  # presigned URL, capped at the deadline


class ObjectStore:
    def __init__(self, settings: ObjectStoreSettings, field: str) -> None:
        try:
            import boto3  # noqa: F401 - only to fail here, with the extra's name
        except ImportError as exc:
            raise SpecError(field, f"an object store needs boto3: pip install '{EXTRA}'") from exc
        if not settings.url.startswith(("http://", "https://")) or not settings.bucket:
            raise SpecError(field, "needs `url` (http:// or https://) and `bucket`")
        for name in (settings.access_key_env, settings.secret_key_env):
            if not os.environ.get(name):
                raise SpecError(field, f"the environment variable {name} (a key of the store) is not set")
        self.settings, self.field = settings, field
        self._client: Any = None
        self.known: set[str] = set()  # keys this process put or found

    def _s3(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            s = self.settings
            self._client = boto3.client(
                "s3", endpoint_url=s.url, region_name=s.region,
                aws_access_key_id=os.environ.get(s.access_key_env, ""),
                aws_secret_access_key=os.environ.get(s.secret_key_env, ""),
                config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                              retries={"max_attempts": 3, "mode": "standard"}))
        return self._client

    def key(self, sha256: str) -> str:
        return f"{self.settings.prefix}{sha256}.tar.gz"

    def _put_once(self, data: bytes, sha256: str) -> bool:
        """Put the archive unless it is there already; True when this call uploaded it."""
        from botocore.exceptions import ClientError

        key, s3 = self.key(sha256), self._s3()
        if key in self.known:
            return False
        try:
            head = s3.head_object(Bucket=self.settings.bucket, Key=key)
            if int(head.get("ContentLength", -1)) == len(data):
                self.known.add(key)
                return False
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) not in ("404", "NoSuchKey", "NotFound"):
                raise
        s3.put_object(Bucket=self.settings.bucket, Key=key, Body=data, ContentType="application/gzip")
        self.known.add(key)
        return True

    def _presign(self, sha256: str, expiry_s: int) -> str:
        return str(self._s3().generate_presigned_url(
            "get_object", Params={"Bucket": self.settings.bucket, "Key": self.key(sha256)}, ExpiresIn=expiry_s))

    async def share(self, data: bytes, sha256: str, deadline: float) -> str:
        """The archive in the store (put at most once), and a presigned GET URL that lives until
        the deadline (at most `expiry_s`)."""
        from botocore.exceptions import BotoCoreError, ClientError

        expiry = int(max(60, min(self.settings.expiry_s, deadline - time.time())))
        try:
            await to_thread(self._put_once, data, sha256)
            return await to_thread(self._presign, sha256, expiry)
        except BotoCoreError as exc:  # no answer from the store: worth another attempt
            raise Unreachable(f"{self.field}: {type(exc).__name__}: {str(exc)[:300]}") from exc
        except ClientError as exc:  # the store refused (no bucket, denied): the settings' fault
            # the message names the bucket and key, never the keys (botocore does not print them)
            raise Refused(Code.INPUT, f"{self.field}: could not put {self.key(sha256)} into bucket "
                          f"{self.settings.bucket}: {type(exc).__name__}: {str(exc)[:300]}") from exc

    def out_key(self, token: str) -> str:
        """Where a worker puts a job's out/ archive too large to ride in a stream chunk."""
        return f"{self.settings.prefix}out/{token}.tar.gz"

    async def share_put(self, key: str, deadline: float) -> str:
        """A presigned PUT URL for `key` that lives until the deadline (at most `expiry_s`): the worker
        puts the job's out/ there without any key of the store."""
        from botocore.exceptions import BotoCoreError

        expiry = int(max(60, min(self.settings.expiry_s, deadline - time.time())))

        def presign() -> str:
            return str(self._s3().generate_presigned_url(
                "put_object", Params={"Bucket": self.settings.bucket, "Key": key}, ExpiresIn=expiry))

        try:
            return await to_thread(presign)
        except BotoCoreError as exc:
            raise Unreachable(f"{self.field}: {type(exc).__name__}: {str(exc)[:300]}") from exc

    async def get(self, key: str) -> bytes:
        """The object's bytes (the job's out/ a worker put)."""
        from botocore.exceptions import BotoCoreError, ClientError

        def read() -> bytes:
            body = self._s3().get_object(Bucket=self.settings.bucket, Key=key)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

        try:
            return await to_thread(read)
        except BotoCoreError as exc:
            raise Unreachable(f"{self.field}: {type(exc).__name__}: {str(exc)[:300]}") from exc
        except ClientError as exc:
            raise Refused(Code.TRANSFER_FAILED, f"{self.field}: could not get {key} from bucket "
                          f"{self.settings.bucket}: {type(exc).__name__}: {str(exc)[:300]}") from exc

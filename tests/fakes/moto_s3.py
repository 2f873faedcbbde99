"""moto's S3 on loopback for tests (the session's server, tests/fakes/moto_server.py), with a
versioned bucket, so a test can count how many times an object was put.

    with MotoS3(moto, "jobs") as s3:  # s3.endpoint for the settings; s3.client() for the test's own looks
        s3.versions(key)          # every put of key, oldest last
"""

from __future__ import annotations

from typing import Any

from fakes.moto_server import MotoServer, MotoView

ACCESS, SECRET = "AKIAMOTOTESTKEY00001", "moto-test-secret-do-not-ship-0123456789"


class MotoS3(MotoView):
    def __init__(self, server: MotoServer, bucket: str) -> None:
        super().__init__(server)
        self.bucket = bucket
        self.client().create_bucket(Bucket=bucket)
        self.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})

    def client(self) -> Any:
        import boto3  # loaded with the server

        return boto3.client("s3", region_name="us-east-1", endpoint_url=self.endpoint,
                            aws_access_key_id=ACCESS, aws_secret_access_key=SECRET)

    def versions(self, key: str) -> list[dict[str, Any]]:
        got = self.client().list_object_versions(Bucket=self.bucket, Prefix=key)
        return [v for v in got.get("Versions", []) if v["Key"] == key]

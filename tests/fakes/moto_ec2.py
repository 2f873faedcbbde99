"""moto's EC2 on loopback for tests (the session's server, tests/fakes/moto_server.py), and what a test asks of it.

    with MotoEc2(moto) as ec2:      # the session's moto server (fixture `moto`); ec2.endpoint for boto3
        ec2.live("ar-")             # instances tagged by SkyPilot with a cluster name starting so
        ec2.shutdown_behavior(id)   # as describe-instance-attribute reads it

Nothing reaches AWS: every client is built with `endpoint_url` and dummy credentials (fakes.sky.aws_env).
"""

from __future__ import annotations

from typing import Any

from fakes.moto_server import MotoServer, MotoView
from fakes.sky import LIVE, aws_env


class MotoEc2(MotoView):
    def __init__(self, server: MotoServer) -> None:
        super().__init__(server)
        self.instances()  # its EC2 backend is built on first use: not inside a test's time limit

    def client(self, region: str = "us-east-1") -> Any:
        import boto3  # loaded with the server

        env = aws_env()
        return boto3.client("ec2", region_name=region, endpoint_url=self.endpoint,
                            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                            aws_session_token=env["AWS_SESSION_TOKEN"])

    def instances(self, prefix: str = "ar-", region: str = "us-east-1",
                  states: list[str] | None = None) -> list[dict[str, Any]]:
        filters = [{"Name": "tag:skypilot-cluster-name", "Values": [f"{prefix}*"]}]
        if states:
            filters.append({"Name": "instance-state-name", "Values": states})
        got = self.client(region).describe_instances(Filters=filters)
        return [i for r in got["Reservations"] for i in r["Instances"]]

    def live(self, prefix: str = "ar-", region: str = "us-east-1") -> list[dict[str, Any]]:
        return self.instances(prefix, region, LIVE)

    def shutdown_behavior(self, instance_id: str, region: str = "us-east-1") -> str:
        got = self.client(region).describe_instance_attribute(InstanceId=instance_id,
                                                              Attribute="instanceInitiatedShutdownBehavior")
        return str(got["InstanceInitiatedShutdownBehavior"]["Value"])

"""moto in server mode: AWS APIs over real HTTP on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

REGION = "us-east-1"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}


@contextmanager
def moto_server() -> Iterator[str]:
    """Start a ThreadedMotoServer on a free port and yield its endpoint URL."""
    from moto.server import ThreadedMotoServer

    for k, v in CREDS.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def client(service: str, endpoint: str):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"],
    )


def glue_catalog_properties(endpoint: str, bucket: str) -> dict[str, str]:
    """pyiceberg Glue catalog + S3 FileIO against moto (credentials and region always given)."""
    return {
        "glue.endpoint": endpoint,
        "glue.region": REGION,
        "glue.access-key-id": CREDS["AWS_ACCESS_KEY_ID"],
        "glue.secret-access-key": CREDS["AWS_SECRET_ACCESS_KEY"],
        "s3.endpoint": endpoint,
        "s3.region": REGION,
        "s3.access-key-id": CREDS["AWS_ACCESS_KEY_ID"],
        "s3.secret-access-key": CREDS["AWS_SECRET_ACCESS_KEY"],
        "client.region": REGION,
        "client.access-key-id": CREDS["AWS_ACCESS_KEY_ID"],
        "client.secret-access-key": CREDS["AWS_SECRET_ACCESS_KEY"],
        "warehouse": f"s3://{bucket}/warehouse",
    }

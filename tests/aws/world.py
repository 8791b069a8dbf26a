"""The aws tier's world: a moto server (recording who called what), the template deployed into it as the
``icebatch-dev`` stack, a Glue database and warehouse bucket, the model in S3, and an HTTPS Kubernetes API
server that EKS's DescribeCluster names. Each test module gets a world of its own (tests/aws/conftest.py)."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from pathlib import Path

from icebatch.core.settings import Settings

from tests.aws.deploy import ACCOUNT, Deployed, deploy
from tests.support.aws import REGION, client
from tests.support.iam_audit import Recorder
from tests.support.k8s_api import RayJobApi, sts_token_verifier
from tests.support.tls import server_cert

STACK = "icebatch-dev"
NAMESPACE = "icebatch"


@dataclass
class World:
    deployed: Deployed
    k8s: RayJobApi
    endpoint: str
    bucket: str
    database: str
    cluster: str
    home: Path
    reports: str  # a queue subscribed to the reports topic (as an SQS subscriber of the reports would be)
    recorder: Recorder  # every AWS call, by access key

    def launcher_settings(self, **env: str) -> Settings:
        lambda_env = self.deployed.lambda_env("LauncherFunction", **env)
        return Settings.from_env({k: v for k, v in lambda_env.items() if k.startswith(("ICEBATCH_", "AWS_"))})


def _eks_cluster(endpoint: str, name: str, api_url: str, ca_pem: bytes) -> None:
    """An EKS cluster in moto whose DescribeCluster names the tests' HTTPS API server and its CA."""
    from moto.backends import get_backend

    client("eks", endpoint).create_cluster(
        name=name, roleArn=f"arn:aws:iam::{ACCOUNT}:role/eks", resourcesVpcConfig={"subnetIds": []}
    )
    cluster = get_backend("eks")[ACCOUNT][REGION].clusters[name]
    cluster.endpoint = api_url
    cluster.certificate_authority = {"data": base64.b64encode(ca_pem).decode()}


def _upload_model(endpoint: str, model: Path, bucket: str, prefix: str) -> None:
    s3 = client("s3", endpoint)
    s3.create_bucket(Bucket=bucket)
    for path in sorted(model.iterdir()):
        s3.upload_file(str(path), bucket, prefix + path.name)


def make_world(aws_endpoint: str, recorder: Recorder, tiny_model: Path, home: Path, *, stack: str = STACK) -> World:
    """The template deployed as ``stack`` into the moto server at ``aws_endpoint``, with all it reads.

    moto's state is its process's, whichever server serves it: a world made after another in the same process
    finds the other's resources. Its names do not meet them (its stack's own: queues, rules, alarms are named
    after the stack; the rest carry a random suffix), so each test module deploys a stack of its own name."""
    suffix = uuid.uuid4().hex[:8]
    bucket, models, database, cluster = f"wh-{suffix}", f"models-{suffix}", f"support_{suffix}", f"eks-{suffix}"
    client("s3", aws_endpoint).create_bucket(Bucket=bucket)
    _upload_model(aws_endpoint, tiny_model, models, "tiny-llama/")
    sessions: dict[str, dict[str, str]] = {}  # the roles' sessions, once deployed (IAM enforced: tests/support/aws.py)
    k8s = RayJobApi(namespaces={NAMESPACE}, verify_token=sts_token_verifier(cluster, aws_endpoint, sessions))
    tls = server_cert(home / "tls")
    _eks_cluster(aws_endpoint, cluster, k8s.start(tls=tls), tls.ca_pem)
    parameters = {
        "ClusterName": cluster,
        "JobServiceAccount": "icebatch-job",
        "WarehouseBucket": bucket,
        "WarehousePrefix": "warehouse/",
        "SourceDatabase": database,
        "SourceTablePrefix": f"warehouse/{database}.db/tickets/",
        "ResultsTablesPrefix": f"warehouse/{database}.db/tickets_",
        "ModelBucket": models,
        "ModelPrefix": "tiny-llama/",
        "JobImage": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/icebatch-job:test",
    }
    deployed = deploy(stack, parameters, endpoint=aws_endpoint, home=home)
    sessions.update({c["AWS_ACCESS_KEY_ID"]: c for c in deployed.credentials.values()})
    sqs = client("sqs", aws_endpoint)
    reports = sqs.create_queue(QueueName=f"reports-{suffix}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=reports, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    client("sns", aws_endpoint).subscribe(
        TopicArn=deployed.stack.physical["ReportsTopic"], Protocol="sqs", Endpoint=arn
    )
    return World(deployed, k8s, aws_endpoint, bucket, database, cluster, home, reports, recorder)

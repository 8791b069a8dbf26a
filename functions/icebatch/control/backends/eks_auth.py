"""EKS credentials without kubeconfig files: a bearer token from a presigned STS call, endpoint and CA
from ``eks:DescribeCluster``.

The token is what ``aws eks get-token`` prints: ``k8s-aws-v1.`` + unpadded base64url of a presigned
``sts:GetCallerIdentity`` URL whose signature covers the ``x-k8s-aws-id: <cluster>`` header. It is
minted per invocation (valid 15 minutes); the cluster's endpoint and CA are cached for the container's
life.
"""

from __future__ import annotations

import base64
import tempfile
from dataclasses import dataclass
from typing import Any

from icebatch.core.aws_clients import unreachable
from icebatch.core.errors import ClusterPermissionError, ClusterUnavailableError, ConfigError

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_HEADER = "x-k8s-aws-id"
PRESIGN_SECONDS = 60


@dataclass(frozen=True)
class ClusterInfo:
    endpoint: str
    ca_file: str | None


_CLUSTERS: dict[str, ClusterInfo] = {}


def sts_endpoint(session: Any, region: str) -> str:
    """The regional STS endpoint of ``region``'s partition (``sts.cn-north-1.amazonaws.com.cn`` in China).

    EKS calls the URL inside the token itself and accepts only real STS hosts, so no endpoint override
    (``AWS_ENDPOINT_URL``, ``ICEBATCH_AWS_ENDPOINT_URL``) may leak into it.
    """
    from botocore.config import Config

    client = session.client("sts", region_name=region, config=Config(ignore_configured_endpoint_urls=True))
    return str(client.meta.endpoint_url)


def mint_token(session: Any, cluster: str, region: str) -> str:
    """A bearer token for the cluster, signed with the session's credentials."""
    from botocore.model import ServiceId
    from botocore.signers import RequestSigner

    credentials = session.get_credentials()
    if credentials is None:
        raise ConfigError("no AWS credentials to sign the EKS token with (the function's role provides them)")
    signer = RequestSigner(ServiceId("sts"), region, "sts", "v4", credentials, session.events)
    url = signer.generate_presigned_url(
        {
            "method": "GET",
            "url": f"{sts_endpoint(session, region).rstrip('/')}/?Action=GetCallerIdentity&Version=2011-06-15",
            "body": {},
            "headers": {CLUSTER_HEADER: cluster},
            "context": {},
        },
        region_name=region,
        expires_in=PRESIGN_SECONDS,
        operation_name="",
    )
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def cluster_info(eks_client: Any, cluster: str) -> ClusterInfo:
    """Endpoint and CA of the cluster (``eks:DescribeCluster``), cached for the container's life."""
    if cluster in _CLUSTERS:
        return _CLUSTERS[cluster]
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        described = eks_client.describe_cluster(name=cluster)["cluster"]
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "ResourceNotFoundException":
            raise ConfigError(f"EKS cluster {cluster!r} does not exist in this region (ICEBATCH_EKS_CLUSTER)") from e
        # a 403 is a refusal whatever its body says (an error document botocore cannot read leaves only the status)
        if code in {"AccessDeniedException", "UnauthorizedException"} or status == 403:
            raise ClusterPermissionError(
                f"not allowed to describe EKS cluster {cluster!r}: grant the launcher's role eks:DescribeCluster "
                "on it (template.yaml does)"
            ) from e
        raise ClusterUnavailableError(f"eks:DescribeCluster failed ({code})") from e
    except BotoCoreError as e:
        if not unreachable(e):
            raise
        raise ClusterUnavailableError(f"cannot reach the EKS API: {e}") from e
    ca_data = (described.get("certificateAuthority") or {}).get("data")
    ca_file = None
    if ca_data:
        with tempfile.NamedTemporaryFile("wb", prefix="eks-ca-", suffix=".crt", delete=False) as f:
            f.write(base64.b64decode(ca_data))
            ca_file = f.name
    info = ClusterInfo(endpoint=described["endpoint"], ca_file=ca_file)
    _CLUSTERS[cluster] = info
    return info

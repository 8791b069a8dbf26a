"""The production backend: RayJob custom resources on EKS through the kubernetes client.

API errors are mapped by status code, never turned into ``None``:

| status        | meaning here                                     | raised / returned                     |
| ------------- | ------------------------------------------------ | ------------------------------------- |
| 201           | created                                          | ``Submission(created=True)``          |
| 409           | a job of that name exists: already launched      | ``Submission(created=False)``         |
| 401, 403      | the launcher's identity may not do this          | ClusterPermissionError (names the fix)|
| 404 on create | the RayJob CRD is missing (KubeRay not installed)| ConfigError                           |
| 400, 422      | the manifest was rejected (strict field checks)  | ManifestInvalidError                  |
| 429, 5xx, I/O | the API server is busy or unreachable            | ClusterUnavailableError (retryable)   |
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from icebatch.control.backends import JobBackend, Submission
from icebatch.control.jobs import JobState, job_state
from icebatch.control.rayjob import GROUP, PLURAL, VERSION, JobSpec, deployment_selector
from icebatch.core.aws_clients import bounded_config
from icebatch.core.errors import ClusterPermissionError, ClusterUnavailableError, ConfigError, ManifestInvalidError

if TYPE_CHECKING:
    from icebatch.core.settings import Settings

log = logging.getLogger(__name__)
TIMEOUT = (5, 30)  # connect, read (seconds)

RBAC_FIX = (
    "map the launcher's IAM role to the Kubernetes group `icebatch-launcher` with an EKS access entry, and "
    "apply jobimage/k8s/rbac.yaml (a Role allowing create/get/list/patch/delete on rayjobs.ray.io in the "
    "namespace, bound to that group)"
)


class KubeRayBackend(JobBackend):
    def __init__(self, api: Any, namespace: str) -> None:
        self.api = api  # kubernetes.client.CustomObjectsApi
        self.namespace = namespace

    @classmethod
    def from_settings(cls, settings: Settings, *, session: Any = None) -> KubeRayBackend:
        """Endpoint/CA from eks:DescribeCluster (or ICEBATCH_K8S_API_SERVER), token minted now."""
        import boto3
        from kubernetes import client

        from icebatch.control.backends.eks_auth import cluster_info, mint_token

        k8s, aws = settings.kubernetes, settings.aws
        if not (k8s.eks_cluster or k8s.k8s_api_server):
            raise ConfigError(
                "backend=kuberay needs ICEBATCH_EKS_CLUSTER (or ICEBATCH_K8S_API_SERVER for a non-EKS API)"
            )
        session = session or boto3.session.Session(region_name=aws.aws_region)
        region = session.region_name or aws.aws_region
        if not region:
            raise ConfigError("no AWS region for EKS: set ICEBATCH_AWS_REGION (Lambda sets AWS_REGION)")
        cluster = k8s.eks_cluster or "kubernetes"
        if k8s.k8s_api_server:
            host, ca_file = k8s.k8s_api_server, None
        else:
            eks = session.client("eks", region_name=region, endpoint_url=aws.aws_endpoint_url, config=bounded_config())
            info = cluster_info(eks, cluster)
            host, ca_file = info.endpoint, info.ca_file
        token = mint_token(session, cluster, region)
        cfg = client.Configuration()
        cfg.host = host
        cfg.api_key = {"authorization": token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        cfg.verify_ssl = k8s.k8s_verify_ssl
        cfg.ssl_ca_cert = ca_file
        cfg.retries = 1
        return cls(client.CustomObjectsApi(client.ApiClient(cfg)), k8s.k8s_namespace)

    # --------------------------------------------------------------------------------------------
    def list_jobs(self, deployment: str) -> list[JobState]:
        listed = self._call(
            "list",
            self.api.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            label_selector=deployment_selector(deployment),
            _request_timeout=TIMEOUT,
        )
        return [job_state(item) for item in listed.get("items", [])]

    def submit(self, manifest: dict[str, Any], spec: JobSpec) -> Submission:
        try:
            self._call(
                "create",
                self.api.create_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                manifest,
                field_validation="Strict",
                _request_timeout=TIMEOUT,
            )
        except _AlreadyExistsError:
            return Submission(spec.name, created=False, detail="409 AlreadyExists")
        return Submission(spec.name, created=True, detail="201 Created")

    def annotate(self, name: str, annotations: dict[str, str]) -> None:
        self._call(
            "patch",
            self.api.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
            {"metadata": {"annotations": annotations}},
            _request_timeout=TIMEOUT,
        )

    def delete(self, name: str) -> None:
        try:
            self._call(
                "delete",
                self.api.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                _request_timeout=TIMEOUT,
            )
        except _NotFoundError:
            log.info("RayJob %s was already gone", name)

    # --------------------------------------------------------------------------------------------
    def _call(self, verb: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            raise self._translate(verb, e) from e
        except (HTTPError, OSError) as e:
            raise ClusterUnavailableError(f"cannot reach the Kubernetes API to {verb} rayjobs: {e}") from e

    def _translate(self, verb: str, e: Any) -> Exception:
        status = int(e.status or 0)
        message = _message(e.body)
        where = f"rayjobs.ray.io in namespace {self.namespace!r}"
        if status == 409 and verb == "create":
            return _AlreadyExistsError(message)
        if status == 404 and verb == "delete":
            return _NotFoundError(message)
        if status in (401, 403):
            return ClusterPermissionError(
                f"the Kubernetes API refused to {verb} {where} ({status}: {message}). Fix: {RBAC_FIX}"
            )
        if status == 404:
            return ConfigError(
                f"{where} not found ({message}): install the KubeRay operator (its CRDs) and create the namespace "
                "(jobimage/k8s/namespace.yaml)"
            )
        if status in (400, 422):
            return ManifestInvalidError(f"the API server rejected the RayJob ({status}): {message}")
        return ClusterUnavailableError(f"the Kubernetes API failed to {verb} {where} ({status}: {message})")


class _AlreadyExistsError(Exception):
    pass


class _NotFoundError(Exception):
    pass


def _message(body: Any) -> str:
    if not body:
        return ""
    try:
        data = json.loads(body)
        return str(data.get("message") or data)
    except (ValueError, AttributeError):
        return str(body)[:300]

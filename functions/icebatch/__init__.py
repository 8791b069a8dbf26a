"""icebatch: incremental, event-driven LLM labelling of Apache Iceberg tables.

The control plane (this package) is small: settings, the incremental ledger (Iceberg metadata only),
launch decisions, RayJob manifests, event contracts, and the Lambda handlers. It imports neither pyarrow,
ray nor vllm. The data plane (the job that the RayJob runs) is ``icebatch_job``.
"""

__version__ = "0.1.0"

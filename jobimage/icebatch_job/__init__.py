"""icebatch's data plane: the job a RayJob runs (Ray Data + vLLM), and local tooling around it."""

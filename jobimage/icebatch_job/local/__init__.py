"""What only a job without a cluster needs: a Ray instance of its own on this machine, and every process of it
ending with the job (``ray_instance``, ``lineage``, ``reaper``, ``shared_memory``). The job on a RayJob's pod
imports none of it."""

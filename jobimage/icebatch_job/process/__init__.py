"""The job's process life: what it starts, how it ends, and that everything it started ends with it.

``runtime`` (the environment, caches under ICEBATCH_HOME, Ray's start and the process's end),
``warm_imports`` (what the driver imports while Ray starts), ``interrupts`` (SIGTERM/SIGINT: commit what is
finished, then exit), ``stall`` (a run that waits too long for a result stops itself), ``lineage`` (the
kernel's guarantees: orphans come back to the job, which ends its tree), ``reaper`` (the watchdog, for a job
killed without notice), ``shared_memory`` (vLLM's queues left in /dev/shm) and ``amx`` (the CPU engine's
AMX tiles). Nothing here imports the other rooms.
"""

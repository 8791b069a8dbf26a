"""The job's process life: what it starts, how it ends, and that everything it started ends with it.

``runtime`` (the environment, caches under ICEBATCH_HOME, Ray's start and the process's end),
``driver_imports`` (what the driver imports while Ray starts), ``engine_processes`` and ``engine_preload``
(the engine's fork server, engine core and model worker), ``interrupts`` (SIGTERM/SIGINT: commit what is
finished, then exit), ``stall`` (a run that waits too long for a result stops itself), ``lineage`` (the
kernel's guarantees: each process dies with its parent, orphans come back to the job) and ``reaper`` (the
watchdog, for Ray's agents). Nothing here imports the other rooms.
"""

"""The engine stage: Ray Data LLM's vLLM stage, its engine's processes forked from a warm server
(``icebatch_job.process.engine_processes``) and its answers finished in the actor
(``icebatch_job.stages.engine_outputs``: decoded once, only the fields the parse reads)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from icebatch_job.process.engine_processes import engine_processes_from_fork_server, uses_fork_server
from icebatch_job.stages.engine_outputs import finished_rows


class EngineStageUDF:
    """Ray Data LLM's vLLM stage, with the engine's processes forked from a warm server and its answers finished
    in the actor (module docstring).

    It wraps the stage rather than subclassing it: the module that defines Ray's stage imports torch and
    vLLM, and the fork server must start before those imports, which it then overlaps.
    """

    def __init__(self, *args: Any, process_start: str = "forkserver", **kwargs: Any) -> None:
        if uses_fork_server(kwargs.get("engine_kwargs") or {}, process_start):
            engine_processes_from_fork_server()
        from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF

        self.stage = vLLMEngineStageUDF(*args, **kwargs)

    async def __call__(self, batch: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        async for out in self.stage(batch):
            rows = out.get(self.stage.data_column)  # (Ray's stage yields {} for an empty batch)
            if rows is not None:
                out[self.stage.data_column] = finished_rows(rows, self.stage.llm.engine.tokenizer)
            yield out

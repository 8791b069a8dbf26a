"""How a shared job's runs (``icebatch_job.shared``) split its node: by the tokens of the answers each received."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class Sharing:
    """The consumers whose runs share one engine, and the tokens each has received (exact at their last commits, made
    once every answer is in; a chunk before them records the split so far)."""

    consumers: list[str]
    tokens: dict[str, int] = field(default_factory=dict)  # consumer -> input and output tokens received

    def received(self, consumer: str, batch: pa.Table) -> None:
        import pyarrow.compute as pc

        counted = sum(int(pc.sum(batch.column(c)).as_py() or 0) for c in ("num_input_tokens", "num_generated_tokens"))
        self.tokens[consumer] = self.tokens.get(consumer, 0) + counted

    def split(self, consumer: str) -> dict[str, Any]:
        """``RunTotals``' ``share`` and ``shared_with`` for ``consumer``'s run (even while no run has tokens)."""
        total, mine = sum(self.tokens.values()), self.tokens.get(consumer, 0)
        share = min(1.0, max(mine / total, 1e-6)) if total else 1 / len(self.consumers)
        return {"share": share, "shared_with": tuple(c for c in self.consumers if c != consumer)}

"""A durable turn's checkpoints: its finished model requests, waiting for the run's next write.

A durable turn does not store a model request in a transaction of its own. When a request ends, its
record (the response and the chunks it streamed) waits here, and the run's next write that happens
anyway carries it in the same transaction: a tool's claim (so a request is stored before any of its
tools runs), the turn's close, or a stream log batch (a tool step's end, or the next request's start
when no claim came between). Log batches also carry the run's finished tool
results (claims and closes record them already), so a stored request never saw a result the store
lacks, and a finished tool's result is stored before the next request's answer can be.

Every one of those writes is fenced by `worker`, the process running the run: once another process
adopted the run they fail (the log's store nothing), so a zombie never writes over its successor.

A turn this process began (not one it took over), on routes with no `after_turn`, names its
workflow's executor (`workflow_executor`): its close then ends the workflow's row in the same
transaction (`bastion.stores.turn_workflows`), and `workflow_ended` says it committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TurnCheckpoints"]


@dataclass(eq=False)
class TurnCheckpoints:
    """The records of a turn's finished model requests not yet stored, by step, and the run's tool
    results (`results` is the run state's `unrecorded_results` list itself)."""

    worker: int
    results: list[dict[str, Any]] = field(default_factory=list)
    workflow_executor: str | None = None
    workflow_ended: bool = False
    pending: dict[int, dict[str, Any]] = field(default_factory=dict)
    _logged: list[dict[str, Any]] = field(default_factory=list)

    def add(self, step: int, record: dict[str, Any]) -> None:
        self.pending[step] = record

    def take(self) -> list[dict[str, Any]]:
        """The records the next write carries (`[{step, record}]`); pending until `stored`."""
        return [{"step": step, "record": record} for step, record in self.pending.items()]

    def stored(self, taken: list[dict[str, Any]]) -> None:
        """The write carrying `taken` committed: those records are stored."""
        for item in taken:
            if self.pending.get(item["step"]) is item["record"]:
                del self.pending[item["step"]]

    def take_results(self) -> list[dict[str, Any]]:
        """The tool results no log batch stored yet. They stay in `results`: the run's next claim or
        close records them again, which changes nothing (only operations in flight are settled)."""
        self._logged = [result for result in self._logged if any(result is r for r in self.results)]
        return [result for result in self.results if not any(result is r for r in self._logged)]

    def results_logged(self, results: list[dict[str, Any]]) -> None:
        self._logged += results

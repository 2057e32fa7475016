"""The chat turn's DBOS workflow, declared when `bastion.durable` is imported.

A durable chat turn is one workflow named `bastion.turn`. The process that runs the turn writes the
workflow's row itself, beside the run, and ends it with the turn's close (`bastion.stores.turn_workflows`):
DBOS never executes it there. DBOS runs the workflow only when the process died and a live one's
janitor handed it over; then it runs a module-level function in that process, which must find what
takes the turn over in a registry: the one DBOS forces, `TURN_WORKFLOWS`, where each durable chat
endpoint registers by name (`bastion.chat.durable_turns`). Model requests are not DBOS steps: a turn
stores them in bastion's own writes (`bastion.stores.checkpoints`). Declared here, below
`bastion.chat`, the workflow exists as soon as the engine module does, so a process may launch its
engine before it builds its chat routes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Protocol

from bastion._extras import missing_extra

try:
    from dbos import DBOS
except ImportError as error:
    raise missing_extra("bastion.durable", "durable", error) from error

from bastion.durable._ready import registered

__all__ = [
    "TURN_WORKFLOWS",
    "WORKFLOW_NAME",
    "DurableTurnError",
    "TurnTakeOver",
    "TurnWorkflows",
    "turn_workflow_id",
]

WORKFLOW_NAME: Final = "bastion.turn"


class DurableTurnError(RuntimeError):
    """Durable turns cannot run as configured; the message says what to change."""

    code: ClassVar[str] = "durable_turns_unavailable"


def turn_workflow_id(conversation_id: str, run_id: str) -> str:
    """The workflow id of a run's turn: one workflow per claimed run. The store's claims build the
    same id (stores migration 0019: a dead process's run is live while this workflow waits)."""
    return f"{WORKFLOW_NAME}:{conversation_id}:{run_id}"


class TurnTakeOver(Protocol):
    """What finishes a turn whose process died, from the workflow's input (a durable chat endpoint)."""

    async def take_over(self, workflow_input: dict[str, Any]) -> str: ...


class TurnWorkflows:
    """This process's durable chat endpoints by name."""

    def __init__(self) -> None:
        self._take_overs: dict[str, TurnTakeOver] = {}

    def register(self, name: str, take_over: TurnTakeOver) -> None:
        self._take_overs[name] = take_over

    async def run(self, workflow_input: dict[str, Any]) -> str:
        """One turn taken over from a dead process, by the endpoint its input names."""
        take_over = await self._take_over(workflow_input["endpoint"])
        if take_over is None:
            raise DurableTurnError(
                f"No durable chat endpoint named {workflow_input['endpoint']!r} in this process: build "
                "the same chat routes (with durable=) in every worker before launching the engine."
            )
        return await take_over.take_over(workflow_input)

    async def _take_over(self, name: str) -> TurnTakeOver | None:
        """The named endpoint; a workflow handed to this process while it starts waits for its routes."""
        return await registered(lambda: self._take_overs.get(name))


# The one registry DBOS forces (see the module's docstring).
TURN_WORKFLOWS: Final = TurnWorkflows()


@DBOS.workflow(name=WORKFLOW_NAME)
async def _turn_workflow(workflow_input: dict[str, Any]) -> str:
    return await TURN_WORKFLOWS.run(workflow_input)

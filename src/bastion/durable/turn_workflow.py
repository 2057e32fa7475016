"""The chat turn's DBOS workflow, declared when `bastion.durable` is imported.

DBOS recovers a workflow by its name (`bastion.turn`) in whichever process it hands it to, and runs
a module-level function there, so the function must find what runs the turn in a registry: the one
DBOS forces, `TURN_WORKFLOWS`. It holds, for this process, what takes over a turn from a dead process
(registered by name by each durable chat endpoint, `bastion.chat.durable_turns`) and the turns this
process's own requests run, whose end the workflow's body waits for. Model requests are not DBOS
steps: a turn stores them in bastion's own writes (`bastion.stores.checkpoints`), so a turn costs
DBOS only its workflow's row. Declared here, below `bastion.chat`, the workflow exists as soon as
the engine module does, so a process may launch its engine before it builds its chat routes.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Final, Protocol

from bastion._extras import missing_extra

try:
    from dbos import DBOS, SetWorkflowID
except ImportError as error:
    raise missing_extra("bastion.durable", "durable", error) from error

from bastion.durable._ready import registered

__all__ = [
    "TURN_WORKFLOWS",
    "WORKFLOW_NAME",
    "DurableTurnError",
    "TurnTakeOver",
    "TurnWorkflows",
    "start_turn_workflow",
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
    """This process's durable chat endpoints by name, and the turns its own requests run."""

    def __init__(self) -> None:
        self._take_overs: dict[str, TurnTakeOver] = {}
        self._attached: dict[str, asyncio.Future[str]] = {}

    def register(self, name: str, take_over: TurnTakeOver) -> None:
        self._take_overs[name] = take_over

    def attach(self, workflow_id: str) -> asyncio.Future[str]:
        """The future the turn this process runs sets when it ends, however it ended, which the
        workflow's body returns: a turn's workflow never stays pending while its process lives."""
        attached: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._attached[workflow_id] = attached
        return attached

    def detach(self, workflow_id: str) -> None:
        self._attached.pop(workflow_id, None)

    async def run(self, workflow_id: str | None, workflow_input: dict[str, Any]) -> str:
        """One turn: the one this process's request attached (its end), or one taken over from a dead
        process."""
        attached = self._attached.pop(workflow_id, None) if workflow_id is not None else None
        if attached is not None:
            return await attached
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
    return await TURN_WORKFLOWS.run(DBOS.workflow_id, workflow_input)


async def start_turn_workflow(workflow_id: str, workflow_input: dict[str, Any]) -> Any:
    """Start the turn's workflow under its id; the handle."""
    with SetWorkflowID(workflow_id):
        return await DBOS.start_workflow_async(_turn_workflow, workflow_input)

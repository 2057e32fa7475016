"""What a chat turn is, as plain data, and what a durable turn adds to it.

`ChatTurn` is who asks and for which conversation: data a turn's context can be built from anywhere
(a durable turn rebuilds it in the process that takes it over). `DurableTurnHooks` is what
`bastion.chat.durable_turns` hands `ChatEndpoint.open_turn`, so that module needs only this one, not
the endpoint's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bastion.auth import Principal
from bastion.stores.entities import StoreIdentity

if TYPE_CHECKING:
    from bastion._loop import ExecuteToolHook, ModelSteps
    from bastion.chat.stream_response import TurnRunner
    from bastion.stores.checkpoints import TurnCheckpoints
    from bastion.stores.live import ChunkLog

__all__ = ["ChatTurn", "DurableTurnHooks"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatTurn:
    """One chat turn: the verified caller, their store identity, the conversation they chat in and the
    run the turn claimed (`run_id` keys the turn's operations, such as the memories it writes)."""

    principal: Principal
    identity: StoreIdentity
    conversation_id: str
    request_id: str
    run_id: str


class DurableTurnHooks(Protocol):
    """What a durable turn (`bastion.chat.durable_turns`) adds to `ChatEndpoint.open_turn`."""

    @property
    def message_id(self) -> str:
        """The response message's id, the same in every execution of the turn."""

    @property
    def steps(self) -> ModelSteps:
        """Runs the turn's model requests, replaying those an earlier execution stored."""

    @property
    def checkpoints(self) -> TurnCheckpoints:
        """The turn's finished model requests not stored yet, which its stream log's writes carry."""

    @property
    def runner(self) -> TurnRunner | None:
        """Runs the turn inside its workflow."""

    def attach(self, log: ChunkLog | None) -> None:
        """The turn's stream log, once it exists."""

    def execute_tool(self, hook: ExecuteToolHook) -> ExecuteToolHook:
        """The tool hook wrapping the run's own."""

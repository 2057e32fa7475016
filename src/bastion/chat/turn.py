"""What a chat turn is, as plain data, and the protocols between the endpoint and durable turns.

`ChatTurn` is who asks and for which conversation: data a turn's context can be built from anywhere
(a durable turn rebuilds it in the process that takes it over). `TurnOpener` is what durable turns
(`bastion.chat.durable_turns`) drive a turn through (`ChatEndpoint` is one), and `DurableTurnHooks`
what they hand it, so neither module imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from bastion.auth import Principal
from bastion.stores.entities import StoreIdentity

if TYPE_CHECKING:
    from bastion._turn_plan import ExecuteToolHook, ModelSteps
    from bastion.chat.stream_response import AgentStreamResponse, TurnRunner
    from bastion.persistence import AgentPersistence, AgentRun
    from bastion.stores.checkpoints import TurnCheckpoints
    from bastion.stores.entities import TurnContext, TurnState
    from bastion.stores.live import ChunkLog, LiveTurns

__all__ = ["ChatTurn", "DurableTurnHooks", "TurnOpener"]


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


class Named(Protocol):
    @property
    def name(self) -> str: ...


class TurnOpener(Protocol):
    """What opens a claimed turn as a stream response, with a durable turn's hooks (`ChatEndpoint`)."""

    @property
    def agent(self) -> Named:
        """The agent answering (its name names the endpoint across processes by default)."""

    @property
    def path(self) -> str:
        """The route's path."""

    @property
    def persistence(self) -> AgentPersistence[TurnContext, TurnState]:
        """The persistence its turns run through."""

    @property
    def live(self) -> LiveTurns | None:
        """Its store's live turns, if it has them."""

    async def open_turn(
        self, turn: ChatTurn, run: AgentRun[Any, Any], *, durable: DurableTurnHooks | None = None
    ) -> AgentStreamResponse:
        """The claimed turn `run` as a stream response: context, prepared session, stream, settlement."""

    @property
    def runs_after_turn(self) -> bool:
        """Whether a completed turn has an `after_turn` to run once it is saved."""

    async def after_saved_turn(
        self, turn: ChatTurn, messages: list[dict[str, Any]], response_message: dict[str, Any]
    ) -> None:
        """Its `after_turn` for a completed turn another process saved (and maybe died before running it)."""

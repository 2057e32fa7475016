"""One chat turn over HTTP: the chat route, the conversations' routes, the stream and durable turns.

`chat_routes` (`bastion.chat.endpoint`) serves `POST /api/chat` to the AI SDK's `useChat`: it claims
the turn, prepares the agent for the caller's context, streams the turn
(`bastion.chat.stream_response`) and settles it once. What follows a claim is the same for every turn
(`bastion.chat.turn_lifecycle`). `conversation_routes` serves the conversations
as HTTP entities, `run_agent` runs the same kind of turn without HTTP (`bastion.chat.headless_turn`),
and `bastion.chat.durable_turns` makes turns survive their process (needs `bastion[postgres]` and
DBOS, so it is imported from its module, not from here). `ChatTurn` (`bastion.chat.turn`) is the plain
data a turn carries.
"""

from bastion.chat.conversations import (
    ConversationRules,
    ConversationStore,
    MessagesQuery,
    RuleRefusedError,
    conversation_routes,
)
from bastion.chat.endpoint import (
    AfterTurn,
    ChatEndpoint,
    ChatOptions,
    ChatStore,
    ContextFactory,
    LiveTurnStore,
    ResumeQuery,
    StopResult,
    chat_routes,
)
from bastion.chat.headless_turn import (
    AgentRunContext,
    AgentRunResult,
    ConversationNotFoundError,
    RunOptions,
    RunStore,
    run_agent,
)
from bastion.chat.request import ChatRequest, UIMessagePart, WireUIMessage
from bastion.chat.stream_response import (
    DEFAULT_ERROR_TEXT,
    UI_MESSAGE_STREAM_HEADERS,
    AgentStreamResponse,
    OnFinish,
    OnSettled,
    StreamLog,
    StreamStatus,
    TurnRunner,
    create_agent_stream_response,
)
from bastion.chat.turn import ChatTurn, DurableTurnHooks

__all__ = [
    "DEFAULT_ERROR_TEXT",
    "UI_MESSAGE_STREAM_HEADERS",
    "AfterTurn",
    "AgentRunContext",
    "AgentRunResult",
    "AgentStreamResponse",
    "ChatEndpoint",
    "ChatOptions",
    "ChatRequest",
    "ChatStore",
    "ChatTurn",
    "ContextFactory",
    "ConversationNotFoundError",
    "ConversationRules",
    "ConversationStore",
    "DurableTurnHooks",
    "LiveTurnStore",
    "MessagesQuery",
    "OnFinish",
    "OnSettled",
    "ResumeQuery",
    "RuleRefusedError",
    "RunOptions",
    "RunStore",
    "StopResult",
    "StreamLog",
    "StreamStatus",
    "TurnRunner",
    "UIMessagePart",
    "WireUIMessage",
    "chat_routes",
    "conversation_routes",
    "create_agent_stream_response",
    "run_agent",
]

"""Deprecated: the stream response moved to `bastion.chat` (`bastion.chat.stream_response`)."""

from bastion._moved import moved_names

_NEW_HOMES = {
    "AgentStreamResponse": "bastion.chat",
    "AgentStreamResult": "bastion",
    "DEFAULT_ERROR_TEXT": "bastion.chat",
    "OnFinish": "bastion.chat",
    "OnSettled": "bastion.chat",
    "StreamLog": "bastion.chat",
    "StreamStatus": "bastion.chat",
    "TurnRunner": "bastion.chat",
    "UIMessage": "bastion.chat.stream_response",
    "UI_MESSAGE_STREAM_HEADERS": "bastion.chat",
    "create_agent_stream_response": "bastion.chat",
}

__all__ = sorted(_NEW_HOMES)
__getattr__ = moved_names(__name__, _NEW_HOMES, rest="bastion.chat.stream_response")

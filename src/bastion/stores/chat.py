"""Deprecated: the chat route moved to `bastion.chat` (`bastion.chat.endpoint`)."""

from bastion._moved import moved_names

_NEW_HOMES = {
    "ChatEndpoint": "bastion.chat",
    "ChatStore": "bastion.chat",
    "ChatTurn": "bastion.chat",
    "ContextFactory": "bastion.chat",
    "DurableTurnHooks": "bastion.chat",
    "LiveTurnStore": "bastion.chat",
    "ResumeQuery": "bastion.chat",
    "StopResult": "bastion.chat",
    "chat_routes": "bastion.chat",
}

__all__ = sorted(_NEW_HOMES)
__getattr__ = moved_names(__name__, _NEW_HOMES, rest="bastion.chat.endpoint")

"""Deprecated: the conversations' routes moved to `bastion.chat` (`bastion.chat.conversations`)."""

from bastion._moved import moved_names

_NEW_HOMES = {
    "ConversationRules": "bastion.chat",
    "ConversationStore": "bastion.chat",
    "InvalidRequestError": "bastion.api",
    "MessagesQuery": "bastion.chat",
    "RuleRefusedError": "bastion.chat",
    "conversation_routes": "bastion.chat",
    "json_body": "bastion.api",
}

__all__ = sorted(_NEW_HOMES)
__getattr__ = moved_names(__name__, _NEW_HOMES, rest="bastion.chat.conversations")

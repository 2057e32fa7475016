"""Deprecated: `run_agent` moved to `bastion.chat` (`bastion.chat.headless_turn`)."""

from bastion._moved import moved_names

_NEW_HOMES = {
    "AgentRunContext": "bastion.chat",
    "AgentRunResult": "bastion.chat",
    "ConversationNotFoundError": "bastion.chat",
    "RunStore": "bastion.chat",
    "run_agent": "bastion.chat",
}

__all__ = sorted(_NEW_HOMES)
__getattr__ = moved_names(__name__, _NEW_HOMES, rest="bastion.chat.headless_turn")

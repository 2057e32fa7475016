"""Deprecated: the inbox's bot turn moved to `bastion.inbox.bot_turn` (its names are in `bastion.inbox`)."""

from bastion._moved import moved_names

_NEW_HOMES = {
    "InboxTurn": "bastion.inbox.bot_turn",
    "answer_as_contact": "bastion.inbox.bot_turn",
    "handoff_to_human": "bastion.inbox.bot_turn",
    "user_only_policy": "bastion.inbox.bot_turn",
}

__all__ = sorted(_NEW_HOMES)
__getattr__ = moved_names(__name__, _NEW_HOMES, rest="bastion.inbox.bot_turn")

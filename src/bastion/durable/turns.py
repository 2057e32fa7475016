"""Deprecated: durable chat turns moved to `bastion.chat.durable_turns`."""

from bastion._moved import moved_names

_NEW_HOMES = {
    "DurableTurnError": "bastion.chat.durable_turns",
    "DurableTurns": "bastion.chat.durable_turns",
    "prune_finished_turns": "bastion.chat.durable_turns",
    "turn_workflow_id": "bastion.chat.durable_turns",
}

__all__ = sorted(_NEW_HOMES)
__getattr__ = moved_names(__name__, _NEW_HOMES, rest="bastion.chat.durable_turns")

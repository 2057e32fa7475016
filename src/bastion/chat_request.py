"""Deprecated: the chat request's types moved to `bastion.chat.request`."""

from bastion._moved import moved_names

_NEW_HOMES = {
    "ChatRequest": "bastion.chat",
    "UIMessagePart": "bastion.chat",
    "UI_MESSAGE_CHUNK": "bastion.chat.request",
    "UI_MESSAGE_STREAM_END": "bastion.chat.request",
    "UUID_PATTERN": "bastion.chat.request",
}

_RENAMED = {"UIMessage": ("bastion.chat.request", "WireUIMessage")}

__all__ = sorted([*_NEW_HOMES, *_RENAMED])
__getattr__ = moved_names(__name__, _NEW_HOMES, rest="bastion.chat.request", renamed=_RENAMED)

"""Splitting a knowledge document into chunks that each fit one embedding: paragraphs, then sentences."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["chunk_text"]

_PARAGRAPHS: Final = re.compile(r"\n\s*\n")
_SENTENCES: Final = re.compile(r"(?<=[.!?])\s+")


def chunk_text(text: str, *, max_chars: int = 1000) -> list[str]:
    """Consecutive chunks of at most `max_chars`, split at paragraph, then sentence, then word breaks."""
    if max_chars < 50:
        raise ValueError("max_chars must be at least 50.")
    pieces: list[str] = []
    for paragraph in _PARAGRAPHS.split(text):
        paragraph = " ".join(paragraph.split())
        if not paragraph:
            continue
        if len(paragraph) <= max_chars:
            pieces.append(paragraph)
            continue
        for sentence in _SENTENCES.split(paragraph):
            pieces.extend(_split_words(sentence, max_chars))
    chunks: list[str] = []
    for piece in pieces:
        if chunks and len(chunks[-1]) + 1 + len(piece) <= max_chars:
            chunks[-1] = f"{chunks[-1]} {piece}"
        else:
            chunks.append(piece)
    return chunks


def _split_words(sentence: str, max_chars: int) -> list[str]:
    parts: list[str] = []
    current = ""
    for word in sentence.split():
        while len(word) > max_chars:
            if current:
                parts.append(current)
                current = ""
            parts.append(word[:max_chars])
            word = word[max_chars:]
        if current and len(current) + 1 + len(word) > max_chars:
            parts.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        parts.append(current)
    return parts

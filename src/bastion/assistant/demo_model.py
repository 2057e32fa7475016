"""The offline demo model: deterministic, no provider, and honest about being a demo.

It reads the latest user message and walks the real paths a model would: it streams text word by
word, calls a tool, asks to save a note (which needs approval), loads a skill, remembers the user's
name and answers "what is my name?" from the memory recalled for the turn. Asked, it shows a markdown
reply (heading, list, table, code) or writes a long answer slowly enough to press Stop or reload the
page mid-reply. It is pydantic-ai's `FunctionModel`, so the loop cannot tell it from a provider.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, SystemPromptPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bastion.assistant.demo_replies import (
    DEMO_NOTICE,
    LONG_ANSWER,
    MARKDOWN_SAMPLE,
    help_for,
    summarise_result,
)
from bastion.memory.provider import RECALL_HEADER
from bastion.policies import GENERIC_TOOL_ERROR

__all__ = ["DEMO_NOTICE", "LONG_ANSWER_WORD_DELAY", "demo_model"]

LONG_ANSWER_WORD_DELAY = 0.06
"""Seconds between the words of the long answer: about 25 s in all, time to press Stop or reload."""

_ASKS_FOR_MARKDOWN = re.compile(r"\bmarkdown\b|\bformatting\b", re.IGNORECASE)
_ASKS_FOR_LONG = re.compile(r"\blong (?:story|answer|reply)\b|\bin detail\b", re.IGNORECASE)


def demo_model(*, word_delay: float = LONG_ANSWER_WORD_DELAY) -> FunctionModel:
    """A deterministic stand-in for a model provider; `word_delay` paces its long answer."""

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        async for item in _respond(messages, info, word_delay):
            yield item

    return FunctionModel(stream_function=respond, model_name="bastion-demo")


async def _respond(
    messages: list[ModelMessage], info: AgentInfo, word_delay: float
) -> AsyncIterator[str | DeltaToolCalls]:
    offered = {tool.name for tool in info.function_tools}
    result = _latest_tool_result(messages)
    if result is not None:
        for word in _words(_describe_result(result)):
            yield word
        return
    text = _latest_user_text(messages).strip()
    recalled = _recalled_answer(text, messages)
    if recalled is not None:
        for word in _words(recalled):
            yield word
        return
    call = _choose_tool(text, offered)
    if call is not None:
        name, arguments = call
        yield {0: DeltaToolCall(name=name, json_args=json.dumps(arguments), tool_call_id=None)}
        return
    if _ASKS_FOR_LONG.search(text):
        for word in _words(LONG_ANSWER):
            await asyncio.sleep(word_delay)
            yield word
        return
    if _ASKS_FOR_MARKDOWN.search(text):
        for line in MARKDOWN_SAMPLE.splitlines(keepends=True):
            yield line
        return
    tips = help_for(offered)
    reply = f"{DEMO_NOTICE} You said: “{text[:200]}”. {tips}" if text else f"{DEMO_NOTICE} {tips}"
    for word in _words(reply):
        yield word


def _choose_tool(text: str, offered: set[str]) -> tuple[str, dict[str, Any]] | None:
    lowered = text.lower()

    def says(pattern: str) -> bool:
        return re.search(pattern, lowered) is not None

    name = re.match(r"^(?:my name is|call me)\s+([^.,!?]{1,80})", text, flags=re.IGNORECASE)
    if name and "remember" in offered:
        return "remember", {"fact": f"The user's name is {name.group(1).strip()}."}
    remember = re.match(r"^(?:please\s+)?(?:remember|note)(?:\s+that)?[:\s]+(.+)$", text, flags=re.IGNORECASE)
    if remember and "save_note" in offered:
        return "save_note", {"text": remember.group(1).strip()[:500]}
    if (says(r"\bwho am i\b") or says(r"\bidentity\b")) and "get_identity" in offered:
        return "get_identity", {}
    if (says(r"\bhow should\b") or says(r"\bguide\b") or says(r"\bskill")) and "load_skill" in offered:
        return "load_skill", {"name": "note-writing"}
    if says(r"\bnotes\b") and "list_notes" in offered:
        return "list_notes", {}
    if (says(r"\bhuman\b") or says(r"\bperson\b")) and "handoff_to_human" in offered:
        return "handoff_to_human", {"reason": "The contact asked for a person."}
    search = re.match(r"^search\s+(.+)$", text, flags=re.IGNORECASE)
    remote_search = sorted(name for name in offered if name.endswith("__search"))
    if search and remote_search:
        return remote_search[0], {"query": search.group(1).strip()[:200]}
    return None


def _recalled_answer(text: str, messages: list[ModelMessage]) -> str | None:
    """ "What is my name?" answered from this turn's recalled memory, as a model reading it would."""
    if not re.search(r"\bwhat(?: is|'s) my name\b", text, flags=re.IGNORECASE):
        return None
    recall = _latest_recall(messages)
    found = re.search(r"The user's name is ([^.\"\n]+)", recall)
    if found is None:
        return f"I don't know your name yet. Tell me “my name is …” and I will remember it. ({DEMO_NOTICE})"
    return f"Your name is {found.group(1)}: I remembered it from an earlier conversation. ({DEMO_NOTICE})"


def _latest_recall(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, SystemPromptPart) and part.content.startswith(RECALL_HEADER):
                    return part.content
    return ""


def _latest_tool_result(messages: list[ModelMessage]) -> ToolReturnPart | None:
    last = messages[-1] if messages else None
    if not isinstance(last, ModelRequest):
        return None
    returns = [part for part in last.parts if isinstance(part, ToolReturnPart)]
    return returns[-1] if returns else None


def _latest_user_text(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    content = part.content
                    if isinstance(content, str):
                        return content
                    return " ".join(item for item in content if isinstance(item, str))
    return ""


def _describe_result(result: ToolReturnPart) -> str:
    if result.outcome == "denied":
        return "Understood, I did not do that."
    said = result.content if isinstance(result.content, str) else GENERIC_TOOL_ERROR
    if result.outcome == "failed" and said != GENERIC_TOOL_ERROR:
        return f"The tool said: {said[:300]}"
    if result.outcome in ("failed", "retried", "interrupted"):
        return "That did not work. Please try again."
    return f"{summarise_result(result.tool_name, result.content)} ({DEMO_NOTICE})"


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [word + " " for word in words[:-1]] + [words[-1]]

"""What the offline demo model says: a markdown sample, a long answer to stop and resume, tool results
in words, and the suggestions that fit where it runs (the chat page or the support widget)."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["DEMO_NOTICE", "LONG_ANSWER", "MARKDOWN_SAMPLE", "help_for", "summarise_result"]

DEMO_NOTICE: Final = "This is bastion's offline demo model; set BASTION_MODEL to use a real one."

CHAT_HELP: Final = (
    "Try: “who am I?”, “my name is Ada”, “what is my name?”, “remember that the launch is on Friday”, "
    "“show my notes”, “how should I write notes?”, “show me markdown”, or “explain bastion in detail” "
    "(a long reply: press Stop, or reload the page while it writes)."
)
WIDGET_HELP: Final = "Try: “I would like to talk to a person”, or ask anything: the demo bot echoes it."

MARKDOWN_SAMPLE: Final = f"""## What a reply can hold

A model's reply is **markdown**, shown as it streams:

- lists, like this one
- `inline code` and links, such as [the API reference](/docs)
- tables and fenced code, below

| Part | Where it lives |
| --- | --- |
| Conversations | Postgres, under row-level security |
| Durable turns | DBOS, in the same database |
| Memory | pgvector, per user |

```python
from bastion import define_agent, tool


@tool
async def get_time() -> str:
    \"\"\"The server's time.\"\"\"
    return "12:00"


agent = define_agent(name="clock", instructions="Tell the time.", tools=[get_time])
```

_{DEMO_NOTICE}_"""

_LONG_TEXT: Final = """## bastion, in detail

bastion serves AI agents to many users over HTTP, with Postgres as the system of record. Every request
carries a signed token; the server verifies it and acts only as that user, and Postgres checks the same
identity again through row-level security, so one user can never read another's conversations even if a
query forgets a filter.

A chat turn starts when the page posts the conversation's messages. The server compares them with what
it stored, keeps only a legitimate next step, and claims the conversation so that two tabs cannot answer
at once. The model's reply streams back to the page word by word, and every word is also written to a
log the server keeps for the turn: a page that reloads in the middle of a reply reads that log from the
start and follows the rest of the reply live, as you can try now by reloading this page.

Tools run on the server, never in the browser. A tool that changes something, such as saving a note,
waits for the user's approval; the page shows a card with Approve and Deny, and the answer travels back
in the next request. Tool results reach the model, but secrets and internal errors never do: a tool that
fails says so in words chosen for people.

Turns are durable. They run as DBOS workflows in the same Postgres, so a server that crashes in the
middle of a reply leaves a turn that another server takes over. Event hooks deliver what happened
(messages, usage, tool calls) to other systems at least once and in order per conversation, from an
outbox written in the same transaction as the turn.

Memory is per user. The assistant remembers what it is told to remember, recalls the memories nearest
each new message, and lists them in the Memory dialog, where the user can forget any of them. A support
inbox lets a bot answer contacts from a widget and hand the conversation to staff when a person is asked
for.

Press Stop at any moment: the server ends the turn and keeps what was written so far, and the page marks
the reply as stopped. {DEMO_NOTICE}"""
LONG_ANSWER: Final = "\n\n".join(" ".join(part.split()) for part in _LONG_TEXT.split("\n\n")).replace(
    "{DEMO_NOTICE}", DEMO_NOTICE
)


def help_for(offered: set[str]) -> str:
    """The suggestions that fit the tools this agent has: the chat's, or the support widget's."""
    return CHAT_HELP if "save_note" in offered or "remember" in offered else WIDGET_HELP


def summarise_result(tool_name: str, content: Any) -> str:
    """A tool's result told in words, as a model would: never the raw JSON."""
    found = content if isinstance(content, dict) else {}
    if tool_name == "get_identity":
        who = "a guest" if found.get("is_anonymous") else f"the user {found.get('user_id', 'unknown')}"
        return f"You are signed in as {who}, with the role “{found.get('role', 'unknown')}”."
    if tool_name == "list_notes":
        notes = [note.get("text", "") for note in found.get("notes") or [] if isinstance(note, dict)]
        if not notes:
            return "You have no notes yet. Say “remember that …” to save one."
        shown = "; ".join(f"“{_short(text)}”" for text in notes[:5])
        more = f" and {len(notes) - 5} more" if len(notes) > 5 else ""
        return f"You have {len(notes)} note{'s' if len(notes) != 1 else ''}: {shown}{more}."
    if tool_name == "save_note":
        return f"Done: I saved your note “{_short(str(found.get('text', '')))}”."
    if tool_name == "load_skill":
        return f"I read the guide “{found.get('name', 'note-writing')}”: notes are best short, one fact each."
    if tool_name == "remember":
        return "Got it: I will remember that, in this conversation and the next ones."
    if tool_name == "forget":
        return "Done: I have forgotten it."
    if tool_name == "handoff_to_human":
        return "I have asked a member of staff to take over; they will answer here."
    if tool_name.endswith("__search"):
        return f"The search finished ({_count(content)})."
    return f"{tool_name} finished ({_count(content)})."


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _count(content: Any) -> str:
    if isinstance(content, dict | list):
        return f"{len(content)} item{'s' if len(content) != 1 else ''} in its result"
    return "no details"

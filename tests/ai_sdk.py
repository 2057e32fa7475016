"""The real AI SDK chat clients (ai 7 and 6, installed under tests/js) driven from tests through node."""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest

JS_DIR = Path(__file__).parent / "js"
SDKS = ["7", "6"]


@functools.cache
def _installed() -> Path:
    if not (JS_DIR / "node_modules" / "ai7").is_dir() or not (JS_DIR / "node_modules" / "ai6").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS_DIR, check=True, capture_output=True)
    return JS_DIR


def ai_sdk_dir() -> Path:
    """The directory holding the clients, installed from the committed lock file when missing."""
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed: the AI SDK client tests run the `ai` package under node")
    return _installed()


async def run_chat(
    sdk: str,
    url: str,
    actions: list[dict[str, Any]],
    *,
    messages: Sequence[dict[str, Any]] = (),
    headers: Mapping[str, str] | None = None,
    chat_id: str = "chat-1",
    reset_step: bool = False,
    timeout: float = 60,
) -> list[dict[str, Any]]:
    """Run `actions` on one AI SDK chat; returns the chat's state after each action, with the HTTP
    requests the action made. With `reset_step` the client resumes with `?resetStep=1` (AI SDK 7).
    A client still busy after `timeout` seconds is killed and fails the test."""
    js_dir = ai_sdk_dir()
    process = await asyncio.create_subprocess_exec(
        "node",
        "read-chat.mjs",
        cwd=js_dir,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    request = {
        "sdk": sdk,
        "url": url,
        "chatId": chat_id,
        "messages": list(messages),
        "actions": actions,
        "headers": dict(headers or {}),
        "resetStep": reset_step,
    }
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(json.dumps(request).encode()), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"The AI SDK client did not finish its actions within {timeout} s.") from None
    assert process.returncode == 0, stderr.decode()
    states: list[dict[str, Any]] = json.loads(stdout)
    return states


def send(
    text: str, *, interrupt: Literal["disconnect", "stop"] | None = None, when: str = ""
) -> dict[str, Any]:
    """Send `text`. With `interrupt`, once the reply's text contains `when`: "disconnect" is the
    client's own `stop()` (it only closes the connection), "stop" asks the server's stop route."""
    action: dict[str, Any] = {"type": "send", "text": text}
    if interrupt is not None:
        action["interrupt"] = {"when": when, "by": interrupt}
    return action


def resume() -> dict[str, Any]:
    """`resumeStream()`, what `useChat({ resume: true })` calls when the page mounts."""
    return {"type": "resume"}


def approve(approved: bool, reason: str | None = None, approval_id: str | None = None) -> dict[str, Any]:
    """Answer an approval (the one the latest message waits for unless `approval_id` names one)."""
    action: dict[str, Any] = {"type": "approve", "approved": approved}
    if reason is not None:
        action["reason"] = reason
    if approval_id is not None:
        action["approvalId"] = approval_id
    return action

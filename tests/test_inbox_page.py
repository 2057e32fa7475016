"""The support inbox in real headless Chromium: the demo widget page (a contact talking to the bot) and
the staff's view on the assistant's page (the conversation, Take over, a reply as staff, Hand back),
against the assistant with its demo model and its reply jobs on DBOS."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.ai_sdk import ai_sdk_dir
from tests.pg import PostgresCluster
from tests.test_assistant import chromium_path, serve_assistant


async def _run_inbox_flow(request: dict[str, Any]) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        "node",
        "inbox-flow.mjs",
        cwd=ai_sdk_dir(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(json.dumps(request).encode()), timeout=150)
    assert process.returncode == 0, stderr.decode()[-3000:]
    seen: dict[str, Any] = json.loads(stdout)
    assert "failure" not in seen["steps"], seen["steps"]["failure"]
    assert seen["pageErrors"] == []
    assert seen["consoleErrors"] == []
    return seen["steps"]


async def test_a_contact_talks_to_the_bot_and_staff_take_over_and_hand_back(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    browser = chromium_path()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with serve_assistant(pg_cluster, tmp_path) as served:
        steps = await _run_inbox_flow({"url": served.url, "chromium": browser, "shots": str(shots)})

    [(author, greeting), (bot, answer)] = steps["botAnswered"]["messages"]
    assert (author, greeting, bot) == ("contact", "Hello there", "bot")
    assert "You said: “Hello there”" in answer
    assert steps["botAnswered"]["mode"] == "The bot answers you."
    assert steps["inboxList"] == [["Vera", "Bot"]]
    assert steps["staffSees"] == [["contact", "Hello there"], ["bot", answer]]
    assert steps["takenOver"] == "A person answers"
    assert steps["widgetAfterTakeOver"] == "A member of staff will answer you."
    assert steps["humanConversation"][2:] == [
        ["contact", "Are you a person?"],
        ["staff", "Yes, I am Sam. How can I help?"],
    ]
    [(contact, thanks), (bot, reply)] = steps["backWithTheBot"]
    assert (contact, thanks, bot) == ("contact", "Thanks, bot", "bot") and "Thanks, bot" in reply
    assert steps["handedOff"] == {
        "widgetMode": "A member of staff will answer you.",
        "staffMode": "A person answers",
        "reason": "The contact asked for a person.",
    }

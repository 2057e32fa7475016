"""The assistant's web page in real headless Chromium: the built React page on the AI SDK's `useChat`,
signing in through supabase-js against the development Auth API and against a Supabase stand-in.

The model is scripted (markdown, a long reply, a provider failure; the demo model for the rest) so the
browser sees every kind of turn. Screenshots of the main states go to a `screenshots` folder under the
test's temporary directory.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCalls, FunctionModel

from bastion.assistant.demo_model import demo_model
from tests.ai_sdk import ai_sdk_dir
from tests.live_server import live_server
from tests.pg import PostgresCluster
from tests.supabase_auth import AuthStandIn
from tests.test_assistant import chromium_path, serve_assistant

MARKDOWN = (
    "Here is a **plan**:\n\n"
    "1. Write the tests\n2. Ship it\n\n"
    "- fast\n- safe\n\n"
    "```python\nprint('hello')\n```\n\n"
    "| Tool | State |\n| --- | --- |\n| save_note | approved |\n"
)
# A slow reply streams for about 5 s: the flow acts while it streams (scrolls, reloads, sends from a
# second tab), with room for a loaded machine's stalls.
SLOW_WORDS = 120
PROVIDER_DETAIL = "upstream says: key sk-secret-123 is over quota"


async def scripted(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    """Markdown, a long paced reply or a provider failure by the first word; the demo model otherwise."""
    last = messages[-1]
    prompt = next((part for part in last.parts if isinstance(part, UserPromptPart)), None)
    fresh = isinstance(last, ModelRequest) and not any(isinstance(p, ToolReturnPart) for p in last.parts)
    word = prompt.content.split()[0].lower() if fresh and prompt and isinstance(prompt.content, str) else ""
    if word == "markdown":
        for start in range(0, len(MARKDOWN), 6):
            await asyncio.sleep(0.02)
            yield MARKDOWN[start : start + 6]
    elif word == "slow":
        for number in range(SLOW_WORDS):
            await asyncio.sleep(0.04)
            yield f"word{number}\n\n"
    elif word == "fail":
        raise ModelHTTPError(status_code=503, model_name="scripted", body=PROVIDER_DETAIL)
    else:
        demo = demo_model()
        assert demo.stream_function is not None
        async for item in demo.stream_function(messages, info):
            yield item


async def run_page_flow(request: dict[str, Any]) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        "node",
        "page-flow.mjs",
        cwd=ai_sdk_dir(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    flow = {**request, "slowWords": SLOW_WORDS}
    stdout, stderr = await asyncio.wait_for(process.communicate(json.dumps(flow).encode()), timeout=150)
    assert process.returncode == 0, stderr.decode()[-3000:]
    seen: dict[str, Any] = json.loads(stdout)
    assert "failure" not in seen["steps"], seen["steps"]["failure"]
    assert seen["pageErrors"] == []
    assert seen["consoleErrors"] == []
    return seen["steps"]


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = tmp_path / "screenshots"
    folder.mkdir()
    return folder


async def test_the_page_with_development_sign_in(
    pg_cluster: PostgresCluster, tmp_path: Path, shots: Path
) -> None:
    browser = chromium_path()
    async with serve_assistant(pg_cluster, tmp_path) as served:
        served.app.active_model = FunctionModel(stream_function=scripted, model_name="scripted")
        steps = await run_page_flow(
            {"url": f"{served.url}/", "chromium": browser, "shots": str(shots), "mode": "development"}
        )
        async with await psycopg.AsyncConnection.connect(served.config.database_url or "") as connection:
            cursor = await connection.execute("select rating, comment from bastion.feedback")
            feedback = await cursor.fetchall()

    assert steps["signInPage"] == {
        "devNoteVisible": True,
        "demoBadgeVisible": True,
        "favicon": {"status": 200, "type": "image/svg+xml"},
    }
    assert steps["signedIn"] == {"user": "ada@localhost", "unnamed": []}

    markdown = steps["markdown"]
    assert markdown["whileStreaming"]["stopVisible"] and markdown["whileStreaming"]["items"] >= 1
    assert markdown["code"].strip() == "print('hello')"
    assert markdown["copied"].strip() == "print('hello')"
    assert markdown["headers"] == ["Tool", "State"]
    assert markdown["items"] == ["Write the tests", "Ship it", "fast", "safe"]
    assert markdown["strong"] == ["plan"]
    assert markdown["atBottom"]

    assert steps["multiline"]["beforeSend"] == "first line\nsecond line"
    assert steps["multiline"]["bubble"] == "first line\nsecond line"
    assert steps["multiline"]["inputAfter"] == ""

    assert steps["feedback"]["statuses"] == [201]
    assert steps["feedback"]["shown"] == "Thanks for the feedback."
    assert feedback == [("down", "Too short")]
    assert steps["regenerated"]["triggers"][-1] == "regenerate-message"
    assert steps["regenerated"]["replies"][0] == steps["regenerated"]["replies"][1]
    assert "You said" in steps["regenerated"]["text"]

    assert steps["scrolledUp"] == {"scrollTop": 0, "jumpVisible": True}
    stopped = steps["stopped"]
    assert stopped["text"].split()[:4] == ["word0", "word1", "word2", "word3"]
    assert f"word{SLOW_WORDS - 1}" not in stopped["text"]
    assert stopped["textLater"] == stopped["text"]
    # The page shows the reply as stopped, and it is what the server saved of it.
    assert stopped["note"] == "Stopped: the reply ends here." and stopped["notes"] == 1
    assert stopped["storedText"].split() == stopped["text"].split()
    assert not stopped["errorShown"]
    assert "recovered" not in stopped  # the stop route ended the turn: no reply finished behind the page

    assert "Save a note" in steps["approvalRequested"]["card"]
    assert "Needs your approval" in steps["approvalRequested"]["card"]
    assert "Saved “the launch is on Friday”" in steps["approved"]["card"]
    assert steps["approved"]["rawHidden"]  # the raw JSON is one click away, not on the card
    assert steps["approved"]["raw"]["input"] == {"text": "the launch is on Friday"}
    assert steps["approved"]["raw"]["output"]["text"] == "the launch is on Friday"
    assert "Done: I saved your note “the launch is on Friday”" in steps["approved"]["text"]
    assert "You denied this: “Not a secret for notes”. It did not run." in steps["denied"]["card"]
    assert "I did not do that" in steps["denied"]["text"]
    for raw_state in ("approval-requested", "output-available", "output-denied", "input-available"):
        assert raw_state not in steps["toolCardsText"]

    error = steps["modelError"]["text"]
    assert "could not finish this reply" in error
    assert "sk-secret" not in error and "503" not in error and "quota" not in error

    assert steps["refused"]["input"] == "a message that is refused"
    assert "changed elsewhere" in steps["refused"]["error"]
    assert steps["refused"]["userMessages"][0] == steps["refused"]["userMessages"][1]

    reloaded = steps["reloaded"]
    assert reloaded["titles"] == ["Launch plans"]
    assert "output-available" in reloaded["cards"] and "output-denied" in reloaded["cards"]
    assert reloaded["userTexts"][:2] == ["markdown please", "first line\nsecond line"]
    assert not reloaded["errorShown"]
    # The server has the resume route: a reply reloaded mid-stream carries on after the reload.
    assert reloaded["resumeStatus"] != 404
    # Reloaded mid-reply: the reply continued and completed, once, as the server stored it.
    resumed = steps["resumed"]
    assert resumed["text"].split() == [f"word{n}" for n in range(SLOW_WORDS)]
    assert resumed["stored"][-1].split() == resumed["text"].split()
    assert resumed["replies"] == len(resumed["stored"])
    assert resumed["notes"] == 0 and not resumed["errorShown"]

    # Sent from a second tab while a reply streams: refused as busy, said so, the message kept.
    busy = steps["busy"]
    assert busy["code"] == "turn_conflict"
    assert "still answering in this conversation" in busy["shown"]
    assert not busy["retryOffered"]  # nothing failed: a retry would regenerate the other tab's reply
    assert busy["inputWhileBusy"] == "sent while busy"
    # The second tab followed the first tab's reply to its end, then sent the kept message.
    assert busy["followed"][-1].split() == [f"word{n}" for n in range(SLOW_WORDS)]
    assert busy["firstTab"][-1] == busy["followed"][-1]
    assert busy["userTexts"][-2:] == ["slow please, once more", "sent while busy"]
    assert "You said" in busy["afterwards"] and not busy["errorAfterwards"]
    stored = [text.split() for text in busy["stored"]]
    assert stored[-2:] == [busy["followed"][-1].split(), busy["afterwards"].split()]
    refused_resume = steps["resumeRefused"]
    assert refused_resume["error"] == "The server could not complete this. Try again in a moment.Retry"
    assert refused_resume["userTexts"][-1] == "slow please, a third time"
    assert refused_resume["input"] == ""
    assert refused_resume["retried"].split() == [f"word{n}" for n in range(SLOW_WORDS)]
    assert refused_resume["stored"][-1].split() == refused_resume["retried"].split()
    assert not refused_resume["errorAfter"]
    assert steps["deleted"]["titles"] == ["Launch plans"]

    memory = steps["memory"]
    assert "The server could not complete this. Try again in a moment." in memory["error"]
    assert "db-7" not in memory["error"] and "pool" not in memory["error"]
    assert "could not complete" not in memory["before"]  # opened again, it tried again and got the list
    assert "Nothing remembered yet" in memory["before"]
    assert memory["focusAfterEscape"] == "memory-button"
    assert not memory["rememberAsked"]  # remembering needs no approval in the assistant's permission map
    assert "Remember about you" in memory["rememberCard"]
    assert [(m["text"], m["forget"]) for m in memory["remembered"]] == [
        ("The user's name is Ada.", "Forget “The user's name is Ada.”")
    ]
    assert "Your name is Ada" in memory["recalled"] and "remembered it" in memory["recalled"]
    assert "Nothing remembered yet" in memory["afterForget"] and "Ada" not in memory["afterForget"]
    assert memory["focusAfterForget"] == "memory-close"
    assert memory["stored"] == []

    signed_out = steps["signedOut"]
    for trace in ("ada", "Ada", "Launch plans", "launch is on Friday", "word1"):
        assert trace not in signed_out["html"]
    assert signed_out["stored"] == []
    assert signed_out["hash"] == ""

    second = steps["secondUser"]
    assert second["user"] == "bob@localhost"
    assert second["titles"] == [] and second["messages"] == 0
    assert "Launch plans" not in second["text"] and "ada" not in second["text"]
    assert second["probe"]["status"] == 404
    assert "Nothing remembered yet" in second["memoryShown"] and "Ada" not in second["memoryShown"]
    assert second["memoryProbe"] == {"forget": 404, "history": 404, "memories": []}

    phone = steps["phone"]
    for state in (phone["closed"], phone["opened"]):
        assert state["scrollWidth"] <= 390
        assert state["messages"] >= 360 and state["prompt"] >= 250 and state["card"] >= 300
    assert not phone["closed"]["sidebarVisible"] and phone["opened"]["sidebarVisible"]
    assert phone["focused"] == "new"  # the opened drawer has the focus; Escape closed it
    dialog = phone["memoryDialog"]
    assert dialog["scrollWidth"] <= 390 and dialog["left"] >= 0 and dialog["right"] <= 390
    assert phone["approved"] == ["output-available"]
    assert len(list(shots.glob("*.png"))) >= 10


async def test_the_page_with_supabase_sign_in(
    pg_cluster: PostgresCluster, tmp_path: Path, shots: Path
) -> None:
    browser = chromium_path()
    auth = AuthStandIn(passwords={"ada@example.com": "correct horse"})
    with live_server(auth.app()) as auth_url:
        auth.url = auth_url
        async with serve_assistant(
            pg_cluster, tmp_path, supabase_url=auth_url, supabase_publishable_key="sb_publishable_test"
        ) as served:
            steps = await run_page_flow(
                {
                    "url": f"{served.url}/",
                    "chromium": browser,
                    "shots": str(shots),
                    "mode": "supabase",
                    "authUrl": auth_url,
                    "password": "correct horse",
                }
            )

    assert steps["signInPage"] == {
        "devNoteVisible": False,
        "fields": ["email", "password"],
        "magicLink": True,
        "guest": True,
    }
    assert steps["wrongPassword"]["error"] == "That email and password do not match."
    signed_in = steps["signedIn"]
    assert signed_in["user"] == "ada@example.com"
    assert "Check who you are" in signed_in["card"] and "ada@example.com" in signed_in["card"]
    # The first session was short-lived: supabase-js refreshed it, and the page sent the new token.
    assert auth.refreshed
    assert signed_in["chatTokens"] and all(
        t.removeprefix("Bearer ") in auth.refreshed for t in signed_in["chatTokens"]
    )
    assert auth.sign_outs >= 1
    assert steps["signedOut"]["stored"] == []
    assert "ada@example.com" not in steps["signedOut"]["text"]
    magic = steps["magicLink"]
    assert magic["notice"] == "Check grace@example.com for a sign-in link."
    assert magic["user"] == "grace@example.com"
    assert magic["titles"] == []
    assert "access_token" not in magic["address"]
    assert steps["guest"]["user"] == "Guest"
    assert "offline demo model" in steps["guest"]["reply"]
    assert steps["sessionEnded"] == {
        "notice": "Your session has ended. Sign in again.",
        "stored": [],
        "hash": "",
        "signOutVisible": False,
    }

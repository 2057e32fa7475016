"""A new user's first hour on the page, in real headless Chromium at desktop and phone sizes, with the
offline demo model (its long answer paced faster, to keep the test short): long titles, the code block,
Stop and resume, each error state, the phone's top bar and inbox, and the API reference at `/docs`.

Screenshots of each state go to a `screenshots` folder under the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from bastion.assistant.demo_model import DEMO_NOTICE, demo_model
from bastion.assistant.demo_replies import LONG_ANSWER
from tests.ai_sdk import ai_sdk_dir
from tests.pg import PostgresCluster
from tests.test_assistant import chromium_path, serve_assistant


async def run_first_hour(request: dict[str, Any]) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        "node",
        "first-hour.mjs",
        cwd=ai_sdk_dir(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(json.dumps(request).encode()), timeout=240)
    assert process.returncode == 0, stderr.decode()[-3000:]
    seen: dict[str, Any] = json.loads(stdout)
    assert "failure" not in seen["steps"], seen["steps"]["failure"]
    assert seen["pageErrors"] == []
    assert seen["consoleErrors"] == []  # a content-security-policy violation would be one
    return seen["steps"]


async def test_a_new_users_first_hour_on_desktop_and_phone(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    browser = chromium_path()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with serve_assistant(pg_cluster, tmp_path) as served:
        served.app.active_model = demo_model(word_delay=0.02)
        steps = await run_first_hour({"url": f"{served.url}/", "chromium": browser, "shots": str(shots)})

    assert "letters, digits, dots, dashes or underscores" in steps["signInNote"]

    # Long titles: one line each, cut with an ellipsis, the row's actions and New always in the list.
    titles = steps["longTitles"]
    assert sorted(titles["titles"]) == sorted(
        [
            "Please plan the launch of the new pricing page with the marketing team before…",
            "Supercalifragilisticexpialidocious-and-then-some-more-words-without-spaces-at-a…",
        ]
    )
    assert all(t["oneLine"] and t["ellipsis"] for t in titles["clipped"]) and any(
        t["cut"] for t in titles["clipped"]
    )
    assert not titles["sidewaysScroll"]
    assert titles["actionsInside"] == [True] * 4 and titles["newInside"]
    assert steps["renameForm"] == {"sameLine": True, "cancelInside": True}

    # The demo model's markdown: heading, list, table, and a highlighted code block whose Copy covers nothing.
    markdown = steps["markdown"]
    assert markdown["heading"] == "What a reply can hold"
    assert markdown["items"] >= 3 and markdown["headers"] == ["Part", "Where it lives"]
    assert markdown["language"] == "python"
    assert {"from", "import", "async", "def", "return"} <= set(markdown["keywords"])
    assert not markdown["copyCoversCode"]
    assert markdown["copied"].startswith("from bastion import define_agent, tool")

    # Tool results in words; a guide's card says its name once.
    assert "You are signed in as the user" in steps["identity"] and "{" not in steps["identity"]
    assert steps["skillCard"].count("note-writing") == 1
    assert steps["denyForm"]["buttonsInView"]

    # Stop, and a reload mid-reply that carries on to the end.
    assert steps["stopped"]["note"] == "Stopped: the reply ends here."
    assert 12 < len(steps["stopped"]["text"].split()) < len(LONG_ANSWER.split())
    resumed = steps["resumed"]
    assert len(resumed["before"].split()) < len(LONG_ANSWER.split())
    assert resumed["after"].split() == LONG_ANSWER.replace("## ", "").split()
    assert DEMO_NOTICE in resumed["after"] and resumed["stopNotes"] == 0

    # Errors, in words, with a stable code for an API client.
    api = steps["api"]
    assert api["empty"]["status"] == 400 and api["empty"]["body"]["code"] == "empty_message"
    assert api["badId"]["body"] == {"code": "invalid_input", "message": "id: must be a UUID.", "field": "id"}
    assert api["apiNotFound"]["status"] == 404 and api["apiNotFound"]["type"] == "application/json"
    assert api["jsonNotFound"] == {
        "status": 404,
        "body": {"code": "not_found", "message": "Nothing exists at this address."},
    }
    too_large = steps["tooLarge"]
    assert too_large["error"] == (
        "Your message is too large to send: this server takes at most 1 MB. Shorten it, then send it again."
    )
    assert not too_large["retry"] and too_large["kept"] == 1_100_000 and too_large["dismissed"]
    assert (
        "Cannot reach the server" in steps["unreachable"]["error"]
        and "Retry" in steps["unreachable"]["error"]
    )
    after = steps["unreachable"]["after"]
    assert "hello again" in after["reply"] and after["users"] == ["hello again"] and not after["error"]
    assert "Conversation not found" in steps["notFound"]["text"] and not steps["notFound"]["prompt"]
    assert "Conversation not found" in steps["othersConversation"]
    wrong = steps["wrongAddress"]
    assert wrong["status"] == 404 and wrong["type"].startswith("text/html")
    assert "Nothing here" in wrong["text"] and "/" in wrong["links"]
    assert steps["sessionEnded"] == {"notice": "Your session has ended. Sign in again.", "signInShown": True}
    assert "Cannot reach the assistant" in steps["serverDown"]["text"] and steps["serverDown"]["recovered"]

    # The API reference: linked from the header, bundled, under the same strict policy.
    assert steps["docsLink"] == "/docs"
    docs = steps["docs"]
    assert "script-src 'self';" in docs["policy"] and "unsafe" not in docs["policy"]
    assert "bastion" in docs["title"].lower()
    assert any("/api/chat" in path for path in docs["operations"])
    assert all(src.startswith("/static/") for src in docs["scripts"])

    # The phone: the inbox and the signed-in name in reach, the code's Copy beside the code.
    phone = steps["phone"]
    assert phone["inbox"] and phone["name"] and phone["memory"] and phone["signOut"]
    assert phone["nameText"] == "ada@localhost" and phone["scrollWidth"] <= 390
    assert not phone["copyCoversCode"] and phone["codeInside"]
    assert phone["inboxOpened"] and phone["inboxScrollWidth"] <= 390
    assert len(list(shots.glob("*.png"))) >= 16

"""A chat worker process for the stream log tests: `python -m tests.live_chat_worker PORT`.

It serves `chat_routes` (not durable) over uvicorn on the test database. The user's text is
`paced <deltas> <milliseconds>`: the model calls the tool `lookup` once, then streams that many text
deltas (`w0 `, `w1 `, …), that many milliseconds apart.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bastion import AgentTools, define_agent, tool
from bastion.auth import SupabaseEnv
from bastion.chat import ChatTurn, chat_routes
from bastion.stores import PostgresStore
from bastion.worker import create_agent_worker

PROJECT_URL = "https://project-ref.supabase.co"


def tools(turn: ChatTurn) -> AgentTools:
    @tool
    async def lookup(key: str) -> dict[str, Any]:
        """Look a key up."""
        return {"key": key}

    return AgentTools(tools=[lookup])


async def paced(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    """A tool call first, then `deltas` text deltas `milliseconds` apart."""
    last = messages[-1]
    first = isinstance(last, ModelRequest) and any(isinstance(part, UserPromptPart) for part in last.parts)
    prompt = next(
        str(part.content)
        for message in reversed(messages)
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    )
    _, deltas, milliseconds = prompt.split()
    if first:
        yield {0: DeltaToolCall(name="lookup", json_args=json.dumps({"key": "k"}), tool_call_id="call-0")}
        return
    for index in range(int(deltas)):
        yield f"w{index} "
        await asyncio.sleep(int(milliseconds) / 1000)


async def main(port: int) -> None:
    store = await PostgresStore.open(os.environ["BASTION_TEST_APP_DSN"], max_size=4)
    agent = define_agent(name="paced", instructions="Answer.", tools=tools)
    routes = chat_routes(
        agent=agent, store=store, model=FunctionModel(stream_function=paced), context=lambda turn: turn
    )
    env = SupabaseEnv(url=PROJECT_URL, jwks=json.loads(os.environ["BASTION_TEST_JWKS"]))
    server = uvicorn.Server(
        uvicorn.Config(
            create_agent_worker(env=env, routes=routes),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
    )
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    try:
        await serving
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))

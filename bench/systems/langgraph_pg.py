"""LangGraph with its Postgres checkpointer: a model node and a `ToolNode`, one thread per chat.

The scripted chat model is a small `BaseChatModel` that emits the `lookup` call, then the words as
separate chunks. The route sends only the new user message (the checkpointer holds the thread) and maps
the graph's `updates` and `messages` streams to the UI message stream, as an application would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from bench.client import HttpRequest
from bench.protocol import CHAT_PATH, chat_request, verify_turn
from bench.script import TOOL_ARGS, TOOL_NAME, lookup_result, requested_words, tool_call_id, word
from bench.systems import ClientConfig, ServerConfig
from bench.systems.limit import HEADERS

ROLE = "peer"
NEEDS_POSTGRES = True
POOL_SIZE = 16


class ScriptedChatModel(BaseChatModel):
    """The script: a tool call when the user just spoke, the words once the tool has answered."""

    @property
    def _llm_type(self) -> str:
        return "bench-script"

    def _chunks(self, messages: list[BaseMessage]) -> Iterator[AIMessageChunk]:
        prompts = [m.content for m in messages if isinstance(m, HumanMessage)]
        if isinstance(messages[-1], ToolMessage):
            for index in range(requested_words(str(prompts[-1]))):
                yield AIMessageChunk(content=word(index))
            return
        call = {
            "name": TOOL_NAME,
            "args": json.dumps(TOOL_ARGS),
            "id": tool_call_id(len(prompts)),
            "index": 0,
        }
        yield AIMessageChunk(content="", tool_call_chunks=[call])  # type: ignore[list-item]

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        merged: AIMessageChunk | None = None
        for chunk in self._chunks(messages):
            merged = chunk if merged is None else merged + chunk
        assert merged is not None
        return ChatResult(
            generations=[ChatGeneration(message=AIMessage(**merged.model_dump(exclude={"type"})))]
        )

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._chunks(messages):
            yield ChatGenerationChunk(message=chunk)


@tool
async def lookup(key: str) -> dict[str, Any]:
    """Look a key up."""
    return lookup_result(key)


def build_graph(checkpointer: AsyncPostgresSaver) -> CompiledStateGraph[Any, Any, Any, Any]:
    model = ScriptedChatModel()

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([lookup]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def create_app(config: ServerConfig) -> Starlette:
    assert config.database_url is not None
    pool = AsyncConnectionPool(
        config.database_url,
        min_size=POOL_SIZE,
        max_size=POOL_SIZE,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    graphs: list[CompiledStateGraph[Any, Any, Any, Any]] = []

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await pool.open(wait=True)
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        graphs.append(build_graph(saver))
        yield
        await pool.close()

    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        text = body["messages"][-1]["parts"][0]["text"]
        run = _events(graphs[0], body["id"], text)
        return StreamingResponse(run, media_type="text/event-stream", headers=HEADERS)

    return Starlette(routes=[Route(CHAT_PATH, chat, methods=["POST"])], lifespan=lifespan)


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def _events(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, text: str
) -> AsyncIterator[bytes]:
    yield _event({"type": "start", "messageId": uuid.uuid4().hex})
    yield _event({"type": "start-step"})
    text_open = False
    config = {"configurable": {"thread_id": thread_id}}
    stream = graph.astream(
        {"messages": [HumanMessage(content=text)]}, config, stream_mode=["updates", "messages"]
    )
    async for mode, payload in stream:
        if mode == "messages":
            message = payload[0]
            if isinstance(message, AIMessageChunk) and isinstance(message.content, str) and message.content:
                if not text_open:
                    text_open = True
                    yield _event({"type": "start-step"})
                    yield _event({"type": "text-start", "id": "text-1"})
                yield _event({"type": "text-delta", "id": "text-1", "delta": message.content})
            continue
        for node, update in payload.items():
            for message in (update or {}).get("messages", []):
                if node == "agent" and isinstance(message, AIMessage):
                    for call in message.tool_calls:
                        start = {
                            "type": "tool-input-start",
                            "toolCallId": call["id"],
                            "toolName": call["name"],
                        }
                        yield _event(start)
                        yield _event({**start, "type": "tool-input-available", "input": call["args"]})
                elif node == "tools" and isinstance(message, ToolMessage):
                    output = json.loads(str(message.content))
                    yield _event(
                        {
                            "type": "tool-output-available",
                            "toolCallId": message.tool_call_id,
                            "output": output,
                        }
                    )
                    yield _event({"type": "finish-step"})
    if text_open:
        yield _event({"type": "text-end", "id": "text-1"})
    yield _event({"type": "finish-step"})
    yield _event({"type": "finish", "finishReason": "stop"})
    yield b"data: [DONE]\n\n"


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    return chat_request(chat_id, messages)


verify_stream = verify_turn

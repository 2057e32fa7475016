"""CPU per streamed text delta: bastion's loop against the bare pydantic-ai model stream, in one run.

The scripted model first calls one tool, then streams 200 words as separate deltas. The baseline reads
the same two model responses with `pydantic_ai.direct.model_request_stream` and nothing else; bastion
runs a whole turn through `define_agent` (tool validation, execution, UI chunks). Rounds alternate so
that both see the same machine conditions; the medians are reported with their spread.

    python bench/loop_overhead.py [--rounds 7] [--turns 40]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

from pydantic_ai.direct import model_request_stream
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.tools import ToolDefinition

from bastion import define_agent, tool

WORDS = 200


async def script(messages: list[ModelMessage], info: AgentInfo) -> Any:
    if len(messages) == 1:
        yield {0: DeltaToolCall(name="lookup", json_args='{"key": "a"}', tool_call_id="call-1")}
        return
    for index in range(WORDS):
        yield f"word{index} "


MODEL = FunctionModel(stream_function=script)


def tools(context: str) -> list[Any]:
    @tool
    async def lookup(key: str) -> dict[str, str]:
        """Look a key up."""
        return {"key": key, "value": "v"}

    return [lookup]


AGENT = define_agent(name="bench", instructions="Answer.", tools=tools)
MESSAGES = [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "go"}]}]


async def bare_turn() -> int:
    definition = ToolDefinition(name="lookup", parameters_json_schema={"type": "object"})
    parameters = ModelRequestParameters(function_tools=[definition], allow_text_output=True)
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content="go")], instructions="Answer.")]
    events = 0
    async with model_request_stream(MODEL, history, model_request_parameters=parameters) as stream:
        async for _ in stream:
            events += 1
        history.append(stream.get())
    history.append(
        ModelRequest(parts=[ToolReturnPart(tool_name="lookup", content={"v": 1}, tool_call_id="call-1")])
    )
    async with model_request_stream(MODEL, history, model_request_parameters=parameters) as stream:
        async for _ in stream:
            events += 1
    return events


async def bastion_turn() -> int:
    session = await AGENT.prepare(context="user-1")
    try:
        result = await session.stream(model=MODEL, messages=MESSAGES)
        deltas = 0
        async for chunk in result:
            if chunk["type"] == "text-delta":
                deltas += 1
        if deltas != WORDS:
            raise RuntimeError(f"bastion streamed {deltas} deltas, expected {WORDS}")
        return deltas
    finally:
        await session.close()


async def cpu_per_delta(turn: Any, turns: int) -> float:
    gc.collect()
    start = time.process_time()
    for _ in range(turns):
        await turn()
    return (time.process_time() - start) / (turns * WORDS) * 1e6


async def main(rounds: int, turns: int) -> None:
    await bare_turn()
    await bastion_turn()
    bare: list[float] = []
    ours: list[float] = []
    for _ in range(rounds):
        bare.append(await cpu_per_delta(bare_turn, turns))
        ours.append(await cpu_per_delta(bastion_turn, turns))
    ratios = [mine / base for mine, base in zip(ours, bare, strict=True)]
    print(f"rounds={rounds} turns/round={turns} deltas/turn={WORDS}")
    print(f"bare model stream : {spread(bare, 'µs/delta')}")
    print(f"bastion full turn : {spread(ours, 'µs/delta')}")
    print(f"ratio             : {spread(ratios, 'x')} (goal ≤ 1.5x)")


def spread(values: list[float], unit: str) -> str:
    """The median with the range seen, so noisy rounds show."""
    return f"{statistics.median(values):6.2f} {unit} (min {min(values):.2f}, max {max(values):.2f})"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--turns", type=int, default=40)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.rounds, arguments.turns))

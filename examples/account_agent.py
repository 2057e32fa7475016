"""A complete agent: a tool, a skill, a permission map with a projected result, and an approval.

Run it with a scripted model (no provider key needed): `python examples/account_agent.py`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bastion import Agent, AgentTools, Skill, ToolCall, ToolPolicy, define_agent, tool


@dataclass(frozen=True)
class Caller:
    """The verified caller; built by the server from the token, never from the request body."""

    user_id: str
    email: str
    plan: str


def account_tools(caller: Caller) -> AgentTools:
    @tool
    async def get_account() -> dict[str, str]:
        """Get the signed-in user's account."""
        return {"user_id": caller.user_id, "email": caller.email, "plan": caller.plan}

    @tool(needs_approval=True)
    async def change_plan(plan: str) -> dict[str, str]:
        """Change the user's plan."""
        return {"user_id": caller.user_id, "plan": plan}

    return AgentTools(tools=[get_account, change_plan])


async def load_billing_guide() -> str:
    return "Plans: free, team, enterprise. Confirm the price before changing a plan."


def hide_email(output: Any, caller: Caller, call: ToolCall) -> Any:
    """The model may see the plan but not the email address; the user's own screen shows it all."""
    return {key: value for key, value in output.items() if key != "email"}


agent: Agent[Caller] = define_agent(
    name="account-helper",
    instructions="Help the user with their account.",
    tools=account_tools,
    skills=[Skill(name="billing", description="How plans and prices work.", load=load_billing_guide)],
    permissions={
        "get_account": ToolPolicy(model_output=hide_email),
        "change_plan": ToolPolicy(can_execute=lambda caller, call: caller.plan != "enterprise"),
        "load_skill": ToolPolicy(),
    },
    max_steps=4,
)


async def scripted_turn(messages: list[Any], info: AgentInfo) -> Any:
    """A stand-in for a real model: look the account up, then answer."""
    if len(messages) == 1:
        calls: DeltaToolCalls = {0: DeltaToolCall(name="get_account", json_args="{}", tool_call_id="call-1")}
        yield calls
    else:
        yield "You are on the team plan."


async def main() -> list[dict[str, Any]]:
    session = await agent.prepare(context=Caller(user_id="user-1", email="ada@example.com", plan="team"))
    try:
        messages = [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Which plan am I on?"}]}]
        result = await session.stream(model=FunctionModel(stream_function=scripted_turn), messages=messages)
        return [chunk async for chunk in result]
    finally:
        await session.close()


if __name__ == "__main__":
    for chunk in asyncio.run(main()):
        print(chunk)

"""A chat server in a few lines: an agent with one tool, its conversations in a store, served to `useChat`.

`app(store, env, model)` is the whole application; serve it with uvicorn. The tests run it.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.models import Model

from bastion import AgentTools, define_agent, tool
from bastion.auth import SupabaseEnv
from bastion.chat import ChatTurn, chat_routes
from bastion.stores import SqliteStore
from bastion.worker import create_agent_worker


def caller_tools(turn: ChatTurn) -> AgentTools:
    @tool
    async def whoami() -> dict[str, str]:
        """The signed-in user's id."""
        return {"user_id": turn.principal.id}

    return AgentTools(tools=[whoami])


agent = define_agent(name="helper", instructions="Answer briefly.", tools=caller_tools)


def app(store: SqliteStore, env: SupabaseEnv, model: Model) -> Any:
    routes = chat_routes(agent=agent, store=store, model=model, context=lambda turn: turn)
    return create_agent_worker(env=env, routes=routes)

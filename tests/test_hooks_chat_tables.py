"""The chat tables equal the conversations after fifty turns through the chat route — answers, approvals
granted and refused, model failures and stops — with `persist_sessions` delivered on DBOS."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from pydantic_ai.messages import ModelMessage, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bastion import define_agent, tool
from bastion.auth import SupabaseEnv
from bastion.chat.endpoint import chat_routes
from bastion.durable import DurableEngine
from bastion.hooks import HookDelivery, HookRegistry, chat_id_of, persist_sessions, queued_deliveries
from bastion.stores import PostgresStore, StoreIdentity
from bastion.worker import create_agent_worker
from tests.hooks_db import HooksDatabase
from tests.supabase_tokens import SigningKeys, es256, user_claims
from tests.test_hooks_sessions import chat_path, expected_path

PROJECT_URL = "https://project-ref.supabase.co"
TENANT = "tenant-a"


class ScriptedTurns(FunctionModel):
    """Answers by the first word of the user's message: `plain`, `approve` (a tool that needs approval),
    `fail` (the model breaks mid-answer) or `cancel` (the user stops the turn mid-answer)."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.caller: tuple[StoreIdentity, str] | None = None
        super().__init__(stream_function=self._stream)

    async def _stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        parts = messages[-1].parts
        if any(isinstance(part, ToolReturnPart) for part in parts):
            yield "Done as approved."
            return
        prompt = next(part.content for part in parts if isinstance(part, UserPromptPart))
        kind = str(prompt).split()[0]
        if kind == "approve":
            call = DeltaToolCall(name="delete_item", json_args='{"item": "x"}', tool_call_id=uuid.uuid4().hex)
            yield {0: call}
            return
        yield "Partial "
        if kind == "fail":
            raise RuntimeError("the model broke")
        if kind == "cancel":
            assert self.caller is not None
            await self.store.live_turns().request_stop(*self.caller)
            await asyncio.Event().wait()
        yield "answer."


def agent_tools(context: Any) -> list[Any]:
    @tool(needs_approval=True)
    async def delete_item(item: str) -> dict[str, str]:
        """Delete an item."""
        return {"deleted": item}

    return [delete_item]


def chunks(response: httpx2.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


async def test_the_chat_tables_equal_the_conversations_after_fifty_turns(
    hooks_database: HooksDatabase, hooks_store: PostgresStore
) -> None:
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    model = ScriptedTurns(hooks_store)
    agent = define_agent(name="helper", instructions="Help.", tools=agent_tools)
    routes = chat_routes(agent=agent, store=hooks_store, model=model, context=lambda turn: turn)
    app = create_agent_worker(env=env, routes=routes)
    users = [str(uuid.uuid4()), str(uuid.uuid4())]
    conversations = {user: str(uuid.uuid4()) for user in users}
    engine = await DurableEngine.launch(hooks_database.app_dsn, recovery_interval=1)
    async with (
        engine,
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http,
    ):
        delivery = await HookDelivery.start(
            engine,
            hooks_store.pool,
            HookRegistry([persist_sessions(hooks_store.pool)]),
            listen_conninfo=hooks_database.app_dsn,
            queue_polling_interval=0.02,
        )
        try:
            runs = 0
            kinds = ["plain", "approve", "fail", "cancel", "plain", "deny"]
            while runs < 50:
                for user in users:
                    kind = kinds[runs // 2 % len(kinds)]
                    runs += await one_turn(
                        http, keys, env, model, hooks_store, user, conversations[user], kind
                    )
            # Delivery is done when nothing waits to be dispatched and nothing is queued.
            for _ in range(1200):
                [status] = await delivery.outbox.status()
                if status.undispatched == 0 and not await queued_deliveries(hooks_store.pool):
                    break
                await asyncio.sleep(0.05)
        finally:
            await delivery.close()
    assert hooks_database.rows("select count(*) from bastion.hook_failures") == [(0,)]
    run_count = 0
    for user, conversation in conversations.items():
        identity = StoreIdentity(user_id=user, tenant_id=TENANT)
        stored = [m.message for m in await hooks_store.list_messages(identity, conversation)]
        assert chat_path(hooks_database, conversation) == expected_path(stored)
        statuses = hooks_database.rows(
            "select id::text, status from bastion.runs where conversation_id = %s order by started_at",
            conversation,
        )
        copied = hooks_database.rows(
            "select id::text, status from bastion.ai_runs where chat_id = %s order by started_at",
            chat_id_of(conversation),
        )
        assert copied == statuses
        assert {status for _, status in statuses} == {
            "completed",
            "waiting_for_approval",
            "failed",
            "cancelled",
        }
        run_count += len(statuses)
        owner = hooks_database.rows(
            "select owner_id::text, tenant_id from bastion.ai_chats where conversation_id = %s", conversation
        )
        assert owner == [(user, TENANT)]
    assert run_count >= 50


async def one_turn(
    http: httpx2.AsyncClient,
    keys: SigningKeys,
    env: SupabaseEnv,
    model: ScriptedTurns,
    store: PostgresStore,
    user: str,
    conversation: str,
    kind: str,
) -> int:
    """One user message of `kind` (an approval answered, approved or denied, is a second run)."""
    claims = user_claims(env.issuer, time.time(), sub=user, app_metadata={"tenant_id": TENANT})
    headers = {"Authorization": f"Bearer {es256(keys, claims)}"}
    identity = StoreIdentity(user_id=user, tenant_id=TENANT)
    model.caller = (identity, conversation)
    text = "approve it" if kind in ("approve", "deny") else f"{kind} please"
    message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}
    body = {"id": conversation, "messages": [message], "trigger": "submit-message"}
    response = await http.post("/api/chat", json=body, headers=headers)
    assert response.status_code == 200, response.text
    if kind not in ("approve", "deny"):
        return 1
    history = [m.message for m in await store.list_messages(identity, conversation)]
    [pending] = [p for p in history[-1]["parts"] if p.get("state") == "approval-requested"]
    pending["state"] = "approval-responded"
    pending["approval"]["approved"] = kind == "approve"
    body = {"id": conversation, "messages": history, "trigger": "submit-message"}
    answered = await http.post("/api/chat", json=body, headers=headers)
    assert answered.status_code == 200, answered.text
    return 2

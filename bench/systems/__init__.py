"""The systems under measurement. Each is a module here exposing the same four things:

- `ROLE`: "subject" (bastion), "peer" (what a user would pick instead) or "limit" (no framework at all);
- `NEEDS_POSTGRES`: whether the harness must give it a database;
- `create_app(config) -> ASGI app`, called in the system's own server process;
- `build_request(chat_id, messages, client) -> HttpRequest` and `verify_stream(response, words=) ->
  VerifiedTurn`, called by the load client (most systems use `bench.protocol`'s as they are).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

SYSTEMS: Final[dict[str, str]] = {
    "bastion": "bench.systems.bastion",
    "bastion-chat-routes": "bench.systems.bastion_chat_routes",
    "bastion-durable": "bench.systems.bastion_chat_routes_durable",
    "bastion-nopersist": "bench.systems.bastion_nopersist",
    "assistant": "bench.systems.assistant",
    "pydantic-ai-adapter": "bench.systems.pydantic_ai_adapter",
    "langgraph-pg": "bench.systems.langgraph_pg",
    "agents-sdk-pg": "bench.systems.agents_sdk_pg",
    "agents-sdk-dbos": "bench.systems.agents_sdk_dbos",
    "pydantic-ai-dbos": "bench.systems.pydantic_ai_dbos",
    "limit": "bench.systems.limit",
}

# Variants that isolate one cost, loadable by name (`--systems`) but not measured by default.
DIAGNOSTIC: Final[dict[str, str]] = {
    "bastion-chat-routes-nolog": "bench.systems.bastion_chat_routes_nolog",
}

_REQUIRED: Final = ("ROLE", "NEEDS_POSTGRES", "create_app", "build_request", "verify_stream")
ROLES: Final = frozenset({"subject", "peer", "limit"})


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What a system's server process is given: its own database (if it needs one) and the signing keys."""

    database_url: str | None
    supabase_url: str
    jwks: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What the load client may put in a request: a signed-in user's access token."""

    bearer_token: str


def load_system(name: str) -> ModuleType:
    """The module of system `name`, checked to expose the whole interface."""
    known = {**SYSTEMS, **DIAGNOSTIC}
    if name not in known:
        raise ValueError(f"Unknown system {name!r}; known: {', '.join(known)}.")
    module = importlib.import_module(known[name])
    missing = [attribute for attribute in _REQUIRED if not hasattr(module, attribute)]
    if missing or module.ROLE not in ROLES:
        raise TypeError(f"System {name} is incomplete: missing {missing or ['a valid ROLE']}.")
    return module

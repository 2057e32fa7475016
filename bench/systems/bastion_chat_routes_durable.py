"""bastion through `chat_routes(..., durable=DurableEngine)`: every turn is also a DBOS workflow.

`bastion-chat-routes` with the process's `DurableEngine` launched on the same database (its `dbos`
schema migrated, the application's role granted it); see `bench.systems._chat_routes`.
"""

from __future__ import annotations

from functools import partial

from bench.systems import _chat_routes
from bench.systems.bastion import build_request, verify_stream

ROLE = "subject"
NEEDS_POSTGRES = True
create_app = partial(_chat_routes.create_app, durable=True)

__all__ = ["NEEDS_POSTGRES", "ROLE", "build_request", "create_app", "verify_stream"]

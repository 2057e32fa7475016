"""Diagnostic: `bastion-chat-routes` over a store without live turns, so the route keeps no stream log.

Not in the default run. Beside `bastion-chat-routes` it shows what the stream log costs a turn; beside
the hand-wired `bastion`, what the rest of `chat_routes` costs (see `bench.systems._chat_routes`).
"""

from __future__ import annotations

from functools import partial

from bench.systems import _chat_routes
from bench.systems.bastion import build_request, verify_stream

ROLE = "subject"
NEEDS_POSTGRES = True
create_app = partial(_chat_routes.create_app, durable=False, log=False)

__all__ = ["NEEDS_POSTGRES", "ROLE", "build_request", "create_app", "verify_stream"]

"""bastion through `chat_routes(...)`, as the README recommends, with its resumable stream log.

The same agent, tool, model, token verification, role and pool as `bastion` (wired by hand); see
`bench.systems._chat_routes`. The client sends back each assistant message as the AI SDK assembles it.
"""

from __future__ import annotations

from functools import partial

from bench.systems import _chat_routes
from bench.systems.bastion import build_request, verify_stream

ROLE = "subject"
NEEDS_POSTGRES = True
create_app = partial(_chat_routes.create_app, durable=False)

__all__ = ["NEEDS_POSTGRES", "ROLE", "build_request", "create_app", "verify_stream"]

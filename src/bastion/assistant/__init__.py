"""The reference assistant: an application built on bastion, served by `bastion serve`.

It needs `bastion[assistant]` (Postgres, MCP, uvicorn, PyJWT and the embedded database).
"""

from bastion._extras import missing_extra

try:
    import jwt  # noqa: F401
    import mcp  # noqa: F401
    import psycopg  # noqa: F401
    import psycopg_pool  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as error:
    raise missing_extra("The reference assistant", "assistant", error) from error

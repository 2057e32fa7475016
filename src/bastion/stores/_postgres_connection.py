"""Postgres connections of the store: one pipelined transaction per call as its caller, and the
SQLSTATEs the migrations raise on purpose translated into the store's errors."""

from __future__ import annotations

import asyncio
import select
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, TypeAlias

from bastion._extras import missing_extra

try:
    import psycopg
    from psycopg.pq import TransactionStatus
    from psycopg.rows import TupleRow
    from psycopg_pool import AsyncConnectionPool
except ImportError as error:
    raise missing_extra("bastion.stores.PostgresStore", "postgres", error) from error

from bastion.persistence import AgentRunInactiveError
from bastion.stores.errors import ConversationBusyError, NotFoundError, TurnConflictError

__all__ = ["Connection", "Pool", "PoolCheck", "caller_transaction", "database_errors", "single_value"]

Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]
Pool: TypeAlias = AsyncConnectionPool[Connection]

# SQLSTATEs raised on purpose by the migrations' functions, and the ones a race produces.
_CONFLICT_STATES: Final = frozenset({"BS409", "23505"})
_LOCK_NOT_AVAILABLE: Final = "55P03"


class PoolCheck:
    """A pool's `check`: a connection the server wrote to while it was idle is tried before a call
    gets it (any other costs nothing), and the first one found broken (the server restarted or
    failed over) has the pool check all its idle ones at once.

    The pool waits a second after a connection fails its check, then a second more for the next:
    checked one by one, the connections a restart broke would keep a call waiting for seconds. Checked
    together, they are replaced while the call waits its first second.
    """

    def __init__(self) -> None:
        self.pool: Pool | None = None
        self._checking: asyncio.Task[None] | None = None

    async def __call__(self, conn: Connection) -> None:
        if not _input_waiting(conn):
            return  # nothing arrived while it was idle: the server has not closed it, no round trip
        try:
            await AsyncConnectionPool.check_connection(conn)
        except Exception:
            if self.pool is not None and (self._checking is None or self._checking.done()):
                self._checking = asyncio.ensure_future(self.pool.check())
            raise


def _input_waiting(conn: Connection) -> bool:
    """Whether the server sent something to an idle pooled connection: a restart's or a failover's
    goodbye (an error, then the end of the stream), as a healthy idle connection receives nothing."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


@asynccontextmanager
async def caller_transaction(
    pool: Pool, set_caller: str, params: tuple[Any, ...]
) -> AsyncIterator[Connection]:
    """One pipelined transaction that first runs `set_caller` (a `set_config(..., true)` statement), so the
    caller's role and claims last exactly as long as the transaction on a pooled connection."""
    async with pool.connection() as conn:
        if not conn.autocommit:
            await conn.set_autocommit(True)
        try:
            async with conn.pipeline():
                await conn.execute("begin")
                await conn.execute(set_caller, params)
                yield conn
                await conn.execute("commit")
        except BaseException:
            await _rollback(conn)
            raise


async def _rollback(conn: Connection) -> None:
    """Leave the connection idle for the pool; a broken one is discarded by the pool instead."""
    try:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.rollback()
    except psycopg.Error:
        pass


@contextmanager
def database_errors() -> Iterator[None]:
    """Translate the SQLSTATEs the store raises on purpose; anything else is a server fault."""
    try:
        yield
    except psycopg.Error as error:
        state = error.sqlstate
        if state == _LOCK_NOT_AVAILABLE:
            raise ConversationBusyError() from error
        if state in _CONFLICT_STATES:
            raise TurnConflictError() from error
        if state == "BS404":
            raise NotFoundError() from error
        if state == "BS410":
            raise AgentRunInactiveError() from error
        raise


def single_value(row: tuple[Any, ...] | None) -> Any:
    assert row is not None
    return row[0]

"""An agent turn served as the AI SDK UI message stream, with its persistence and settlement.

`create_agent_stream_response` turns the loop's chunks into server-sent events that `useChat` (AI SDK 6
and 7) reads unchanged, assembles the final assistant message exactly as the client does, and hands it
to `on_finish` for persistence and then the outcome to `on_settled`, once, before the `finish` event.
The turn is consumed to its end even when the browser goes away, so nothing it saw is lost.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import string
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from bastion._client_json import text_delta_json
from bastion._loop import AgentStreamResult
from bastion._ui_assembly import UIMessageAssembler, to_client_json
from bastion._ui_chunks import UIMessage
from bastion.stores.live import ChunkLog

__all__ = [
    "DEFAULT_ERROR_TEXT",
    "UI_MESSAGE_STREAM_HEADERS",
    "AgentStreamResponse",
    "OnFinish",
    "OnSettled",
    "StreamLog",
    "StreamStatus",
    "TurnRunner",
    "UIMessage",
    "create_agent_stream_response",
]

logger = logging.getLogger("bastion.stream")  # Its name from before the move, which log settings name.

DEFAULT_ERROR_TEXT: Final = "Unable to generate a response. Try again."

UI_MESSAGE_STREAM_HEADERS: Final[Mapping[str, str]] = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
    # Already "encoded": compressing middleware and proxies pass the stream through instead of buffering it.
    "content-encoding": "none",
}

StreamStatus = Literal["completed", "failed", "cancelled"]

# Finish reasons both clients accept (ai 7 adds "interrupted", which ai 6 refuses).
_FINISH_REASONS: Final = frozenset({"stop", "length", "content-filter", "tool-calls", "error", "other"})
_DONE: Final = b"data: [DONE]\n\n"
_ID_ALPHABET: Final = string.ascii_letters + string.digits
# At most this many turns of the event loop gather one write's events (see `_EventChannel._gather`).
_GATHER_TURNS: Final = 32


class StreamLog(Protocol):
    """Where a turn's chunks are also written (a durable log that resumed streams replay)."""

    def add(self, chunk: dict[str, Any]) -> None: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


class OnFinish(Protocol):
    """Persists the final assistant message; called once per turn, also when it failed or was cancelled."""

    def __call__(self, *, response_message: UIMessage, status: StreamStatus) -> Awaitable[None]: ...


class OnSettled(Protocol):
    """Releases what the turn held (a claimed run, a session); called once, after `on_finish`."""

    def __call__(self, *, status: StreamStatus) -> Awaitable[None]: ...


TurnRunner = Callable[[Callable[[], Awaitable[None]]], Awaitable[None]]
"""Runs a whole turn given as `run()` (a durable turn runs it inside its workflow); it must await it."""


def create_agent_stream_response(
    result: AgentStreamResult,
    *,
    original_messages: Sequence[Mapping[str, Any]],
    on_finish: OnFinish | None = None,
    on_settled: OnSettled | None = None,
    on_error: Callable[[Exception], str] | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: str | Callable[[], str] | None = None,
    message_metadata: Any = None,
    usage_metadata: bool = False,
    log: StreamLog | None = None,
    runner: TurnRunner | None = None,
) -> AgentStreamResponse:
    """Serve `result` as the AI SDK UI message stream.

    `original_messages` is the canonical history the turn ran on. When it ends with an assistant message
    (a continuation after an approval) that message is continued: same id, its parts updated, as the
    client does. Otherwise the response message gets `message_id` (or the id it generates), default a
    random id. `message_metadata` goes to the `start` chunk and the message's `metadata`. `on_error(exc)`
    gives the text a client sees for a failure; internals go to the `bastion.stream` logger only.
    `usage_metadata=True` puts the turn's token usage in the `finish` chunk's `messageMetadata`
    (`{"usage": {...}, "requestUsage": [...]}`, in the AI SDK's names: `inputTokens`, `outputTokens`,
    `totalTokens`), merged into the message's `metadata` as the client merges it.
    `log` receives every chunk the client is sent, and is flushed before the turn settles.
    `runner(run)` runs the turn (a durable turn runs it inside its workflow); by default it runs
    beside the sender. `AgentStreamResponse.run_detached()` runs it with no client at all.

    Raises `ValueError` for arguments that could not produce a valid stream, before anything runs.
    """
    message = _response_message(original_messages, message_id)
    start: dict[str, Any] = {"type": "start", "messageId": message["id"]}
    if message_metadata is not None:
        start["messageMetadata"] = _json_value(message_metadata, "message_metadata")
    response_headers = _response_headers(headers)
    turn = _Turn(
        result,
        assembler=UIMessageAssembler(message),
        start=start,
        on_finish=on_finish,
        on_settled=on_settled,
        on_error=on_error,
        usage_metadata=usage_metadata,
        log=log,
    )
    return AgentStreamResponse(turn, headers=response_headers, runner=runner)


def _json_value(value: Any, name: str) -> Any:
    try:
        return to_client_json(value)[1]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be JSON-serializable") from exc


def _response_message(original_messages: Sequence[Mapping[str, Any]], message_id: Any) -> UIMessage:
    if not isinstance(original_messages, Sequence) or not all(
        isinstance(m, Mapping) for m in original_messages
    ):
        raise ValueError("original_messages must be a sequence of UI message objects")
    last = original_messages[-1] if original_messages else None
    if last is not None and last.get("role") == "assistant":
        continued = _json_value(dict(last), "the last original message")
        parts = continued.get("parts")
        if not isinstance(continued.get("id"), str) or not continued["id"]:
            raise ValueError("the continued assistant message has no id")
        if not isinstance(parts, list) or not all(
            isinstance(p, dict) and isinstance(p.get("type"), str) for p in parts
        ):
            raise ValueError("the continued assistant message has invalid parts")
        return dict(continued)
    new_id = message_id() if callable(message_id) else message_id
    if new_id is None:
        new_id = "".join(secrets.choice(_ID_ALPHABET) for _ in range(16))
    if not isinstance(new_id, str) or not new_id:
        raise ValueError("message_id must be a non-empty string or a function returning one")
    return {"id": new_id, "role": "assistant", "parts": []}


def _response_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    application = {name.lower(): value for name, value in (headers or {}).items()}
    clashing = sorted(set(application) & set(UI_MESSAGE_STREAM_HEADERS))
    if clashing:
        raise ValueError(f"headers may not redefine the stream protocol header {clashing[0]!r}")
    return {**application, **UI_MESSAGE_STREAM_HEADERS}


def _event(chunk: Mapping[str, Any]) -> bytes:
    return b"data: " + to_client_json(chunk)[0] + b"\n\n"


class _Turn:
    """Consumes the loop's chunks to the end, assembles the message, settles once, and emits events."""

    def __init__(
        self,
        result: AgentStreamResult,
        *,
        assembler: UIMessageAssembler,
        start: dict[str, Any],
        on_finish: OnFinish | None,
        on_settled: OnSettled | None,
        on_error: Callable[[Exception], str] | None,
        usage_metadata: bool = False,
        log: StreamLog | None = None,
    ) -> None:
        self._usage_metadata = usage_metadata
        self._result = result
        self._log = log
        # bastion's own log keeps each chunk's wire JSON rather than encoding the chunk again.
        self._chunk_log = log if isinstance(log, ChunkLog) else None
        self._assembler = assembler
        self._start = start
        self._on_finish = on_finish
        self._on_settled = on_settled
        self._on_error = on_error
        self._events: _EventChannel | None = None

    async def run(self, events: _EventChannel) -> None:
        """Runs the whole turn; a client disconnect or a cancelled request does not interrupt it."""
        self._events = events
        with anyio.CancelScope(shield=True):
            try:
                self._assembler.apply_metadata(self._start.get("messageMetadata"))
                self._emit(self._start)
                status = await self._consume()
                await self._flush_log()
                finish_metadata = self._finish_metadata()
                self._assembler.apply_metadata(finish_metadata)
                self._hold_finish(status, finish_metadata)
                status = await self._settle(status, finish_metadata)
                finish = self._finish_chunk(status, finish_metadata)
                if self._chunk_log is None:
                    self._emit(finish)
                else:
                    self._send(_event(finish))
                self._send(_DONE)
            finally:
                events.close()
                await self._close_log()

    def _finish_chunk(self, status: StreamStatus, metadata: dict[str, Any] | None) -> dict[str, Any]:
        finish: dict[str, Any] = {"type": "finish"}
        reason = "error" if status == "failed" else self._result.finish_reason
        if reason is not None:
            finish["finishReason"] = reason if reason in _FINISH_REASONS else "other"
        if metadata is not None:
            finish["messageMetadata"] = metadata
        return finish

    def _hold_finish(self, status: StreamStatus, metadata: dict[str, Any] | None) -> None:
        """bastion's log holds the `finish` chunk for the write that closes the run (or its own close):
        it is known before the turn is saved, and sent after."""
        if self._chunk_log is not None:
            wire, parsed = to_client_json(self._finish_chunk(status, metadata))
            self._chunk_log.closing(parsed, wire)

    def _finish_metadata(self) -> dict[str, Any] | None:
        """The turn's token usage, when asked for and the result counts it (bastion's loop does)."""
        usage = getattr(self._result, "usage", None) if self._usage_metadata else None
        if usage is None:
            return None
        requests = getattr(self._result, "request_usage", ())
        return {"usage": usage.as_json(), "requestUsage": [request.as_json() for request in requests]}

    async def _consume(self) -> StreamStatus:
        iterator = aiter(self._result)
        try:
            async for chunk in iterator:
                wire = text_delta_json(chunk)
                if wire is None:
                    wire, parsed = to_client_json(chunk)
                    self._assembler.apply(parsed)
                else:  # a plain text delta, the most frequent chunk: its two strings are all it holds
                    parsed = chunk
                    self._assembler.apply_text_delta(chunk["id"], chunk["delta"])
                self._send(b"data: " + wire + b"\n\n")
                if self._chunk_log is not None:
                    self._chunk_log.add(parsed, wire)
                elif self._log is not None:
                    self._log.add(parsed)
        except (Exception, asyncio.CancelledError) as exc:
            # The turn runs shielded in its own task: a cancellation reaching here came from inside the
            # turn (a tool or a hook), and the turn still has to settle.
            logger.exception("The agent turn failed.")
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await _close_quietly(aclose)
            self._emit({"type": "error", "errorText": self._error_text(exc)})
            return "failed"
        if self._result.cancelled:
            self._emit({"type": "abort"})
            return "cancelled"
        return "completed"

    async def _settle(self, status: StreamStatus, finish_metadata: dict[str, Any] | None) -> StreamStatus:
        if self._on_finish is not None:
            try:
                await self._on_finish(response_message=self._assembler.assembled_message(), status=status)
            except Exception as exc:
                logger.exception("Persisting the response message failed.")
                if status != "failed":
                    self._emit({"type": "error", "errorText": self._error_text(exc)})
                status = "failed"
                self._hold_finish(status, finish_metadata)
        if self._on_settled is not None:
            try:
                await self._on_settled(status=status)
            except Exception:
                logger.exception("Settling the agent turn failed.")
        return status

    def _error_text(self, exc: BaseException) -> str:
        if self._on_error is None or not isinstance(exc, Exception):
            return DEFAULT_ERROR_TEXT
        try:
            text = self._on_error(exc)
        except Exception:
            logger.exception("The stream's on_error formatter failed.")
            return DEFAULT_ERROR_TEXT
        if not isinstance(text, str):
            logger.error("The stream's on_error formatter returned %s, not a string.", type(text).__name__)
            return DEFAULT_ERROR_TEXT
        return text

    def _emit(self, chunk: Mapping[str, Any]) -> None:
        if self._chunk_log is None:
            self._send(_event(chunk))
            if self._log is not None:
                self._log.add(dict(chunk))
            return
        wire, parsed = to_client_json(chunk)
        self._send(b"data: " + wire + b"\n\n")
        self._chunk_log.add(parsed, wire)

    async def _flush_log(self) -> None:
        if self._log is not None:
            try:
                if self._chunk_log is not None:
                    await self._chunk_log.flush_before_close()  # a carried one rides the run's close
                else:
                    await self._log.flush()
            except Exception:
                logger.exception("Writing the turn's stream log failed.")

    async def _close_log(self) -> None:
        if self._log is not None:
            try:
                await self._log.close()
            except Exception:
                logger.exception("Closing the turn's stream log failed.")

    def _send(self, event: bytes) -> None:
        if self._events is not None:
            self._events.send(event)


async def _close_quietly(aclose: Callable[[], Awaitable[object]]) -> None:
    try:
        await aclose()
    except Exception:
        logger.exception("Closing the agent turn's chunk iterator failed.")


class AgentStreamResponse(Response):
    """A Starlette response that streams a turn's events and outlives its client.

    The turn runs in a shielded task beside the sender: when the client disconnects only the sending
    stops, and the response returns once the turn has been consumed and settled.
    """

    def __init__(self, turn: _Turn, *, headers: Mapping[str, str], runner: TurnRunner | None = None) -> None:
        self.status_code = 200
        self.background = None
        self._turn = turn
        self._runner = runner
        self.init_headers(headers)

    async def run_detached(self) -> None:
        """Run the whole turn with no client (a turn taken over from a process that died): it is
        consumed, logged and settled exactly as when a client reads it."""
        events = _EventChannel()
        events.abandon()
        await self._run(events)

    async def _run(self, events: _EventChannel) -> None:
        if self._runner is None:
            await self._turn.run(events)
        else:
            with anyio.CancelScope(shield=True):
                await self._runner(lambda: self._turn.run(events))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        events = _EventChannel()
        async with anyio.create_task_group() as turn_group:
            turn_group.start_soon(self._run, events)
            try:
                await self._deliver(events, receive, send)
            finally:
                events.abandon()

    async def _deliver(self, events: _EventChannel, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as delivery:
                delivery.start_soon(_cancel_on_disconnect, receive, delivery.cancel_scope)
                await send(
                    {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
                )
                async for batch in events.batches():
                    await send({"type": "http.response.body", "body": batch, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                delivery.cancel_scope.cancel()
        except OSError:
            logger.info("The client went away while the agent turn was streaming.")


class _EventChannel:
    """Events from the turn to the sender: sent without waiting, delivered in batches.

    Whatever the turn produced while the previous write was in flight goes out as one write, so a
    fast turn does not cost one write per chunk. Once the client is gone, events are dropped.
    """

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._ready = asyncio.Event()
        self._closed = False
        self._abandoned = False

    def send(self, event: bytes) -> None:
        if not self._abandoned:
            self._pending.append(event)
            self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    def abandon(self) -> None:
        """The sender stopped (the client disconnected): keep nothing more."""
        self._abandoned = True
        self._pending.clear()

    async def batches(self) -> AsyncIterator[bytes]:
        while True:
            if self._pending:
                batch = b"".join(self._pending)
                self._pending.clear()
                yield batch
            elif self._closed:
                return
            else:
                self._ready.clear()
                await self._ready.wait()
                await self._gather()

    async def _gather(self) -> None:
        """Let the event loop turn while each turn brings more events (a producer faster than the
        wire: a scripted or cached reply), up to `_GATHER_TURNS`: one write then carries many chunks.
        A producer that waits between tokens (a model over the network) costs one turn, microseconds."""
        for _ in range(_GATHER_TURNS):
            held = len(self._pending)
            await asyncio.sleep(0)
            if len(self._pending) == held or self._closed:
                return


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()

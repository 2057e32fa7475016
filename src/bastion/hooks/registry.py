"""Named hooks: which event types each takes, what it does with one, and how its failures are retried.

A hook's name is durable: it keys its position in the outbox, its deliveries and its failures, so
renaming a hook starts a new one. A handler must be idempotent by `HookEvent.id`: delivery is at
least once (a worker that dies after the handler ran and before the delivery was recorded delivers
the event again).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from bastion.hooks.events import EVENT_TYPES, HookEvent

__all__ = [
    "BatchHandler",
    "EventIdsHandler",
    "Hook",
    "HookHandler",
    "HookRegistry",
    "RetryPolicy",
    "define_hook",
]

HookHandler = Callable[[HookEvent], Awaitable[None]]
BatchHandler = Callable[[Sequence[HookEvent]], Awaitable[None]]
EventIdsHandler = Callable[[Sequence[int]], Awaitable[None]]

_NAME: Final = re.compile(r"[a-z][a-z0-9_.-]{0,99}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Attempts per delivery, and the wait before attempt n+1: `first_delay * backoff_rate ** (n-1)`,
    at most `max_delay` seconds. After the last attempt the delivery is recorded as given up and the
    hook goes on with its next event (an operator replays it)."""

    max_attempts: int = 8
    first_delay: float = 0.5
    backoff_rate: float = 2.0
    max_delay: float = 300.0

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int or not 1 <= self.max_attempts <= 100:
            raise ValueError("max_attempts must be a whole number from 1 to 100.")
        if not 0 <= self.first_delay <= self.max_delay <= 86_400 or self.backoff_rate < 1:
            raise ValueError("Delays must satisfy 0 <= first_delay <= max_delay <= 86400, backoff_rate >= 1.")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` (counted from 1)."""
        return float(min(self.max_delay, self.first_delay * self.backoff_rate ** (attempt - 1)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Hook:
    """A named subscriber. `start` is where a newly registered hook begins: the outbox's oldest event
    (`earliest`) or only events written after it is registered (`latest`). An attempt that takes
    longer than `timeout` seconds fails.

    `handle_batch`, when given, takes a whole batch of events at once (several conversations', each
    conversation's in order), all or nothing — say in one transaction; delivery then costs a
    round trip per batch rather than per event. When it raises, the batch falls back to `handle`
    event by event, which finds the failing event and retries it alone.

    `handle_event_ids`, when given instead, takes a batch as its events' outbox ids (in the same
    order) and reads the events itself, in the database (`bastion.hook_events`, as `persist_sessions`
    does): delivery then loads no event into this process. It falls back to `handle` the same way."""

    name: str
    events: frozenset[str]
    handle: HookHandler = field(repr=False)
    handle_batch: BatchHandler | None = field(default=None, repr=False)
    handle_event_ids: EventIdsHandler | None = field(default=None, repr=False)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    start: Literal["earliest", "latest"] = "latest"
    timeout: float = 60.0


def define_hook(
    name: str,
    *,
    events: Iterable[str],
    handle: HookHandler,
    handle_batch: BatchHandler | None = None,
    handle_event_ids: EventIdsHandler | None = None,
    retry: RetryPolicy | None = None,
    start: Literal["earliest", "latest"] = "latest",
    timeout: float = 60.0,
) -> Hook:
    """A hook named `name` (lower case, digits, `_ . -`) taking `events` (see `EVENT_TYPES`), each
    passed to `handle` (and batches of them to `handle_batch` or, by id, to `handle_event_ids`, if
    given: see `Hook`)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            "A hook name is lower-case letters, digits, '_', '.' or '-', starting with a letter."
        )
    wanted = frozenset(events)
    unknown = sorted(wanted - EVENT_TYPES)
    if not wanted or unknown:
        raise ValueError(f"A hook takes one or more of the event types; unknown: {unknown}.")
    if start not in ("earliest", "latest"):
        raise ValueError("start is 'earliest' or 'latest'.")
    if not 0 < timeout <= 3600:
        raise ValueError("timeout is between 0 and 3600 seconds.")
    if handle_batch is not None and handle_event_ids is not None:
        raise ValueError("A hook takes batches as events (handle_batch) or ids (handle_event_ids), not both.")
    return Hook(
        name=name,
        events=wanted,
        handle=handle,
        handle_batch=handle_batch,
        handle_event_ids=handle_event_ids,
        retry=retry or RetryPolicy(),
        start=start,
        timeout=timeout,
    )


class HookRegistry:
    """The hooks of an application, by name."""

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self._hooks: dict[str, Hook] = {}
        for hook in hooks:
            self.add(hook)

    def add(self, hook: Hook) -> Hook:
        if hook.name in self._hooks:
            raise ValueError(f"A hook named {hook.name!r} is registered already.")
        self._hooks[hook.name] = hook
        return hook

    def get(self, name: str) -> Hook | None:
        return self._hooks.get(name)

    def __iter__(self) -> Iterator[Hook]:
        return iter(self._hooks.values())

    def __len__(self) -> int:
        return len(self._hooks)

    def __contains__(self, name: object) -> bool:
        return name in self._hooks

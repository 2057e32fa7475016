"""The workflows and steps DBOS runs to deliver hooks' events, and the names they go by.

They reach this process's `HookDelivery` (which starts them) through `activate`: DBOS calls them by
name, with their recorded inputs only, and one recovered before its process activated delivery
waits for it. Workflows of earlier versions stay registered under their
names (`bastion.hooks.deliver_batch`, `bastion.hooks.deliver`), so those in flight across an upgrade
finish; see `bastion.hooks.delivery` for the whole design.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, ParamSpec, TypeAlias, TypeVar

import psycopg
from dbos import DBOS, SetEnqueueOptions, SetWorkflowID

from bastion.durable._ready import REGISTRATION_WAIT_SECONDS, registered

if TYPE_CHECKING:
    from bastion.hooks.delivery import HookDelivery

__all__ = [
    "BATCH_WORKFLOWS",
    "Aside",
    "Batch",
    "SetAside",
    "activate",
    "deactivate",
    "deliver_events",
    "delivery_workflow_id",
    "delivery_workflow_prefix",
    "hook_queue_name",
]

# The names of a hook's batch workflows: this version's and the one an earlier version enqueued.
BATCH_WORKFLOWS: Final = ("bastion.hooks.batch", "bastion.hooks.deliver_batch")
# The durable pauses before a step the outbox could not be reached for runs again (seconds).
FIRST_PAUSE: Final = 1.0
LONGEST_PAUSE: Final = 60.0
_active: HookDelivery | None = None
logger = logging.getLogger("bastion.hooks")
P = ParamSpec("P")
R = TypeVar("R")


def activate(delivery: HookDelivery) -> None:
    global _active
    if _active is not None:
        raise RuntimeError("Hook delivery already runs in this process.")
    _active = delivery


def deactivate(delivery: HookDelivery) -> None:
    global _active
    if _active is delivery:
        _active = None


def hook_queue_name(hook: str) -> str:
    return f"bastion.hooks.{hook}"


def delivery_workflow_prefix(hook: str) -> str:
    """What the id of every delivery workflow of `hook` starts with (batches and their lanes)."""
    return f"bastion.hook:{hook}:"


def delivery_workflow_id(hook: str, first_event_id: int, last_event_id: int, generation: int = 0) -> str:
    base = f"{delivery_workflow_prefix(hook)}{first_event_id:019d}-{last_event_id:019d}"
    return base if generation == 0 else f"{base}:r{generation}"


async def _delivery() -> HookDelivery:
    """This process's delivery, waiting for it while the process starts (`bastion.durable._ready`)."""
    delivery = await registered(lambda: _active)
    if delivery is None:
        raise RuntimeError(
            f"No hook delivery started in this process within {REGISTRATION_WAIT_SECONDS:.0f} s: "
            "start HookDelivery in every process that launches the durable engine."
        )
    return delivery


Batch: TypeAlias = list[tuple[str, list[int]]]
SetAside: TypeAlias = tuple[str, list[int], int]
Aside: TypeAlias = list[SetAside]


@DBOS.step(name="bastion.hooks.deliver_batch")
async def _attempt_batch(hook: str, batch: Batch, generation: int) -> Aside:
    """The previous version's batch step: call the hook with each conversation's events in order;
    returns the conversations set aside, each with its events not yet delivered and how many times
    the first was tried."""
    return await (await _delivery()).attempt_batch(hook, batch, generation)


@DBOS.step(name="bastion.hooks.hold")
async def _hold(hook: str, deliveries: list[tuple[str, str]]) -> None:
    await (await _delivery()).outbox.hold(hook, deliveries)


@DBOS.step(name="bastion.hooks.release")
async def _release(hook: str, conversation: str, workflow_id: str) -> None:
    await (await _delivery()).outbox.release(hook, conversation, workflow_id)


@DBOS.step(name="bastion.hooks.attempt")
async def _attempt(hook: str, event_ids: list[int], generation: int, attempt: int) -> tuple[int, str | None]:
    """Call the hook with each event in order until one fails (the first on its `attempt`th try, the
    others on their first); returns how many succeeded and the error of the one that failed."""
    delivery = await _delivery()
    return await delivery.attempt(hook, event_ids, generation, attempt)


@DBOS.step(name="bastion.hooks.set_aside")
async def _set_aside(hook: str, batch_workflow_id: str, aside: Aside) -> Aside:
    """Hold the conversations set aside for the batch's lanes; returns them as recorded, so a batch
    run again after a crash enqueues the lanes its first run enqueued."""
    lanes = [(conversation, _lane(batch_workflow_id, conversation)) for conversation, _, _ in aside]
    await (await _delivery()).outbox.hold(hook, lanes)
    return aside


async def _until_reached(step: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run a step until the outbox answers it: a transient database error pauses the workflow,
    durably and for longer each time, instead of failing it and losing its events. Each failed try
    is a recorded step, so a workflow run again after a crash takes the same path."""
    pause = FIRST_PAUSE
    while True:
        try:
            return await step(*args, **kwargs)
        except psycopg.OperationalError:
            logger.warning("A hook delivery could not reach the outbox; trying again.", exc_info=True)
        await DBOS.sleep_async(pause)
        pause = min(pause * 2, LONGEST_PAUSE)


def _lane(batch_workflow_id: str, conversation: str) -> str:
    return f"{batch_workflow_id}:c{conversation}"


@DBOS.workflow(name="bastion.hooks.batch")
async def deliver_events(hook: str, batch: Batch, generation: int) -> int:
    """Deliver a batch of the hook's events, setting aside each conversation one of whose events
    failed or that is held already; returns how many conversations were set aside.

    The hook is called in the workflow itself, not in a step (a step's check and record would cost
    DBOS two transactions per batch): a run again after a crash calls it again with the batch, as a
    step not yet recorded would. Its conversations held by the first run's lanes count as held, and
    the lanes come from the recorded `_set_aside`, so the run enqueues what the first one did.

    When the outbox cannot be reached (a transient database error, not the hook's), every
    conversation of the batch is set aside: its lane retries until the outbox answers."""
    try:
        aside = await (await _delivery()).attempt_batch(hook, batch, generation)
    except psycopg.OperationalError:
        logger.warning("Hook %s's batch could not reach the outbox; setting it aside.", hook, exc_info=True)
        aside = [(conversation, event_ids, 0) for conversation, event_ids in batch]
    if not aside:
        return 0
    aside = await _until_reached(_set_aside, hook, DBOS.workflow_id or "", aside)
    await _enqueue_lanes(hook, aside, generation)
    return len(aside)


async def _enqueue_lanes(hook: str, aside: Aside, generation: int) -> None:
    """Enqueue each conversation set aside in its own partition (its UUID) of the hook's queue."""
    own = DBOS.workflow_id or ""
    for conversation, event_ids, tried in aside:
        with SetWorkflowID(_lane(own, conversation)), SetEnqueueOptions(queue_partition_key=conversation):
            await DBOS.enqueue_workflow_async(
                hook_queue_name(hook), _deliver_aside, hook, conversation, event_ids, generation, tried
            )


@DBOS.workflow(name="bastion.hooks.deliver_batch")
async def _deliver_batch(hook: str, batch: Batch, generation: int) -> int:
    """A batch as the previous version enqueued it (the hook called in a step): kept so batches in
    flight across an upgrade still finish."""
    aside = await _attempt_batch(hook, batch, generation)
    if not aside:
        return 0
    own = DBOS.workflow_id or ""
    await _hold(hook, [(conversation, _lane(own, conversation)) for conversation, _, _ in aside])
    await _enqueue_lanes(hook, aside, generation)
    return len(aside)


@DBOS.workflow(name="bastion.hooks.deliver_aside")
async def _deliver_aside(
    hook: str, conversation: str, event_ids: list[int], generation: int, tried: int
) -> int:
    """Deliver one conversation's events set aside to `hook` in order (the first tried `tried` times
    already), then release the conversation's hold; returns how many were given up."""
    policy = (await _delivery()).hook(hook).retry
    if tried:
        await DBOS.sleep_async(policy.delay(tried))
    given_up = await _deliver_in_order(hook, event_ids, generation, tried + 1)
    await _until_reached(_release, hook, conversation, DBOS.workflow_id or "")
    return given_up


@DBOS.workflow(name="bastion.hooks.deliver")
async def _deliver(hook: str, event_ids: list[int], generation: int) -> int:
    """One conversation's events, as the previous version enqueued them (one workflow per
    conversation): kept so deliveries in flight across an upgrade still finish."""
    return await _deliver_in_order(hook, event_ids, generation, 1)


async def _deliver_in_order(hook: str, event_ids: list[int], generation: int, attempt: int) -> int:
    """Deliver events in order, the first on its `attempt`th try, a failing one retried by the hook's
    policy before the next; returns how many were given up."""
    policy = (await _delivery()).hook(hook).retry
    remaining, given_up = list(event_ids), 0
    while remaining:
        done, error = await _until_reached(_attempt, hook, remaining, generation, attempt)
        if done:
            attempt = 1
        remaining = remaining[done:]
        if error is None:
            break
        if attempt >= policy.max_attempts:
            remaining, attempt, given_up = remaining[1:], 1, given_up + 1
            continue
        await DBOS.sleep_async(policy.delay(attempt))
        attempt += 1
    return given_up

"""What the outbox's triggers cost Postgres on the turn's path, with many writers at once.

One embedded Postgres with the hooks' migrations. `--writers` sessions (16 by default, as the hooks
benchmark's users) each commit, `--pairs` times per round, one run event and one assistant message
(a turn writes two of each) in a conversation of their own, straight in SQL, so nothing but Postgres
runs. Rounds alternate the outbox's triggers disabled and enabled, and each enabled round is
compared with the disabled round just before it. Reported: Postgres's CPU per pair with the triggers
off, what the triggers add per turn (two pairs), median and range over the rounds, and the ratio of
these writes' Postgres CPU off over on (a whole turn's Postgres CPU is several times theirs: see
`bench/hooks.py`). Neighbouring rounds cancel the drift of a shared machine; the absolute figures
still move with its load.

    python -m bench.hooks_outbox [--writers 16] [--pairs 200] [--rounds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
from pathlib import Path

import psycopg

from bench.hooks import prepare
from bench.postgres import BenchPostgres
from bench.servers import children_cpu_seconds

TRIGGERS = (("run_events", "hook_outbox_run_events"), ("messages", "hook_outbox_messages_inserted"))
TEXT = " ".join(f"word{index}" for index in range(20))
# One session's round: each pair a run event and an assistant message, committed together.
PAIRS = """
do $$
declare
  v_message text;
begin
  for i in 1..%(pairs)s loop
    insert into bastion.run_events (conversation_id, owner_id, run_id, type, data)
    values ('%(conversation)s', '%(owner)s', gen_random_uuid(), 'run.completed', '{"usage": {"tokens": 20}}');
    v_message := 'm' || (i + %(base)s);
    insert into bastion.messages (conversation_id, seq, id, role, message, owner_id)
    values ('%(conversation)s', i + %(base)s, v_message, 'assistant',
            jsonb_build_object('id', v_message, 'role', 'assistant', 'parts',
                               jsonb_build_array(jsonb_build_object('type', 'text', 'text', '%(text)s'))),
            '%(owner)s');
    commit;
  end loop;
end $$;
"""


def measure(uri: str, postgres_pid: int, *, writers: int, pairs: int, rounds: int) -> list[str]:
    sessions = [psycopg.connect(uri, autocommit=True) for _ in range(writers)]
    try:
        admin = sessions[0]
        conversations = [
            admin.execute(
                "insert into bastion.conversations (id, owner_id, title)"
                " values (gen_random_uuid(), gen_random_uuid(), '') returning id, owner_id"
            ).fetchone()
            for _ in range(writers)
        ]
        admin.execute("update bastion.hook_wakeups set wanted = false")  # as under a busy dispatcher
        written, outbox_rows = [0], [0]

        def one_round(enabled: bool) -> float:
            state = "enable" if enabled else "disable"
            for table, trigger in TRIGGERS:
                admin.execute(f"alter table bastion.{table} {state} trigger {trigger}")
            base, cpu = written[0], children_cpu_seconds(postgres_pid)
            threads = [
                threading.Thread(
                    target=session.execute,
                    args=(
                        PAIRS % {"pairs": pairs, "conversation": c, "owner": o, "base": base, "text": TEXT},
                    ),
                )
                for session, (c, o) in zip(sessions, conversations, strict=True)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            spent = (children_cpu_seconds(postgres_pid) - cpu) / (writers * pairs)
            written[0] += pairs
            # The triggers wrote both events of each pair, or nothing: a broken setup measures nonsense.
            row = admin.execute("select count(*) from bastion.hook_events").fetchone()
            expected = outbox_rows[0] + (2 * writers * pairs if enabled else 0)
            assert row is not None and row[0] == expected, (row, expected)
            outbox_rows[0] = expected
            return spent

        one_round(True)  # warm up both
        one_round(False)
        off, added = [], []
        for _ in range(rounds):
            off.append(one_round(False))
            added.append(one_round(True) - off[-1])
    finally:
        for session in sessions:
            session.close()
    per_pair, extra = statistics.median(off), sorted(added)
    turn = 2 * per_pair  # a turn writes two run events and two messages
    with_triggers = turn + 2 * statistics.median(extra)
    # Postgres's CPU clock ticks every 10 ms: rounds too short to register show as nothing spent.
    measured = turn > 0 and with_triggers > 0
    ratio = f"{turn / with_triggers:.2f}" if measured else "not measured (rounds too short)"
    return [
        f"Postgres CPU per pair (run event + message, committed), triggers off: {per_pair * 1e6:.0f} us"
        f" ({writers} writers, {pairs} pairs each, median of {rounds} rounds)",
        f"the outbox's triggers add per turn (two pairs): {2 * statistics.median(extra) * 1e6:.0f} us"
        f" [{2 * extra[0] * 1e6:.0f} to {2 * extra[-1] * 1e6:.0f}]",
        f"these writes' Postgres CPU, triggers off / on: {ratio}",
    ]


async def run(*, writers: int, pairs: int, rounds: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bastion-outbox-bench-") as directory:
        postgres = BenchPostgres(Path(directory))
        try:
            uri = postgres.create_database("outbox")
            await prepare(uri, hooks=True)
            return await asyncio.to_thread(
                measure, uri, postgres.pid, writers=writers, pairs=pairs, rounds=rounds
            )
        finally:
            postgres.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=8)
    arguments = parser.parse_args()
    for line in asyncio.run(run(writers=arguments.writers, pairs=arguments.pairs, rounds=arguments.rounds)):
        print(line)


if __name__ == "__main__":
    main()

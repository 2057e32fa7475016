"""The `bastion` command: `serve` the reference assistant, `migrate` its database, print a `token`,
show, replay, prune or forget its event `hooks`, and review held MCP tool changes (`mcp`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from bastion import MissingExtraError, __version__
from bastion.request_log import configure_logging

if TYPE_CHECKING:
    from datetime import timedelta

    from bastion.assistant.config import AssistantConfig
    from bastion.hooks.outbox import Pool


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the chosen subcommand."""
    parser = argparse.ArgumentParser(prog="bastion", description="Serve AI agents over HTTP.")
    parser.add_argument("--version", action="version", version=f"bastion {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the reference assistant")
    migrate = commands.add_parser("migrate", help="apply the database migrations and exit")
    token = commands.add_parser("token", help="print a development sign-in token for USER")
    token.add_argument("user", help="a user name (letters, digits, dots, dashes, underscores)")
    hooks = commands.add_parser(
        "hooks",
        help="list the event hooks' lag and failures, replay one, prune the delivered, forget a retired one",
    )
    hooks.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=("list", "failures", "replay", "prune", "forget"),
        help="default: list",
    )
    hooks.add_argument("hook", nargs="?", help="the hook to show failures of, to replay or to forget")
    hooks.add_argument("--from", dest="from_event", type=int, help="replay from this event id on")
    hooks.add_argument(
        "--older-than", help="prune: events every hook has passed older than this age (30d, 12h, 45m, 90s)"
    )
    memory = commands.add_parser("memory", help="list the memory extraction jobs that gave up")
    memory.add_argument(
        "action", nargs="?", default="failures", choices=("failures",), help="default: failures"
    )
    mcp = commands.add_parser(
        "mcp", help="list the MCP tool changes held for approval, approve one or refuse one"
    )
    mcp.add_argument("action", nargs="?", default="changes", choices=("changes", "approve", "refuse"))
    mcp.add_argument("change", nargs="?", type=int, help="the id of the change to approve or refuse")
    mcp.add_argument("--application", default="assistant", help="whose approved lists (default: assistant)")
    mcp.add_argument(
        "--status",
        default="pending",
        choices=("pending", "approved", "refused", "accepted", "all"),
        help="changes: which to list (default: pending)",
    )
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1, or BASTION_HOST)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8000, or BASTION_PORT)")
    migrate.add_argument(
        "--grant-app-role",
        action="store_true",
        help="also let the role of BASTION_APP_DATABASE_URL act as users (embedded: bastion_app, created)",
    )
    for command in (serve, migrate, token, hooks, memory, mcp):
        command.add_argument(
            "--data-dir", type=Path, help="where local state lives (default .bastion, or BASTION_DATA_DIR)"
        )
    args = parser.parse_args(argv)
    # The embedded database's helper library warns about a runtime directory it does not need here.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    configure_logging(json_lines=os.environ.get("BASTION_LOG_FORMAT", "").lower() == "json")

    try:
        from bastion.assistant.config import AssistantConfig
        from bastion.assistant.server import STARTUP_ERRORS, fail
    except MissingExtraError as error:
        print(f"bastion: {error}", file=sys.stderr)
        return 2
    try:
        config = AssistantConfig.from_env(
            host=getattr(args, "host", None), port=getattr(args, "port", None), data_dir=args.data_dir
        )
        if args.command == "serve":
            return _serve(config)
        if args.command == "migrate":
            return asyncio.run(_migrate(config, grant_app_role=args.grant_app_role))
        if args.command == "mcp":
            return asyncio.run(_mcp(config, args.action, args.change, args.application, args.status))
        if args.command == "memory":
            return asyncio.run(_memory_failures(config))
        if args.command == "hooks":
            return asyncio.run(_hooks(config, args.action, args.hook, args.from_event, args.older_than))
        return _token(config, args.user)
    except STARTUP_ERRORS as error:
        return fail(error)


def _progress(message: str) -> None:
    print(f"bastion: {message}", file=sys.stderr, flush=True)


def _serve(config: AssistantConfig) -> int:
    from bastion.assistant.server import serve

    # `kill` (SIGTERM) and a closed terminal (SIGHUP) stop the server as Ctrl+C does: everything it
    # started, the embedded database too, is stopped before it exits. (While it serves, SIGTERM first
    # drains it: `bastion.draining_server`; uvicorn takes SIGINT and SIGHUP and raises them again here.)
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, progress=_progress))
    _progress("stopped.")
    return 0


async def _migrate(config: AssistantConfig, *, grant_app_role: bool) -> int:
    from bastion.assistant.database import grant_app_role_of, migrate, open_database

    _progress("Connecting to DATABASE_URL…" if config.database_url else "Starting the embedded database…")
    database = await open_database(
        database_url=config.database_url, app_database_url=config.app_database_url, data_dir=config.data_dir
    )
    try:
        applied = await migrate(database, grant_app_role=False)
        _progress(f"applied {', '.join(applied)}." if applied else "the database is up to date.")
        if grant_app_role:
            role = await grant_app_role_of(database)
            _progress(
                f"the role {role} may act as users and write turns."
                if role
                else "the application connects as the database owner; it may write turns."
            )
    finally:
        database.close()
    return 0


async def _hooks(
    config: AssistantConfig, action: str, hook: str | None, from_event: int | None, older_than: str | None
) -> int:
    import psycopg
    from psycopg_pool import AsyncConnectionPool
    from sqlalchemy.exc import SQLAlchemyError  # DBOS's client's; with the hooks' extra

    from bastion.assistant.database import open_database
    from bastion.hooks import HookEventPruned
    from bastion.hooks.report import parse_age

    if action == "replay" and (hook is None or from_event is None):
        _progress("replay needs a hook and --from EVENT_ID, e.g. bastion hooks replay usage --from 120")
        return 2
    if action == "forget" and hook is None:
        _progress("forget needs the hook's name, e.g. bastion hooks forget usage")
        return 2
    age = None
    if action == "prune":
        try:
            age = parse_age(older_than or "")
        except ValueError as error:
            _progress(f"prune needs --older-than AGE, e.g. bastion hooks prune --older-than 30d ({error})")
            return 2
    database = await open_database(
        database_url=config.database_url, app_database_url=config.app_database_url, data_dir=config.data_dir
    )
    try:
        async with AsyncConnectionPool(
            database.app_conninfo, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
        ) as pool:
            lines = await _hooks_report(pool, database.app_conninfo, action, hook, from_event, age)
    except HookEventPruned as error:
        _progress(f"{error.code}: {error}")
        return 2
    except LookupError as error:
        _progress(str(error))
        return 2
    except (psycopg.Error, SQLAlchemyError) as error:
        return _could_not_finish(f"hooks {action}", error)
    finally:
        database.close()
    print("\n".join(lines))
    return 0


async def _hooks_report(
    pool: Pool, conninfo: str, action: str, hook: str | None, from_event: int | None, age: timedelta | None
) -> list[str]:
    from bastion.hooks.report import failures_report, forget_hook, prune_hooks, replay_hook, status_report

    if action == "list":
        return await status_report(pool)
    if action == "failures":
        return await failures_report(pool, hook)
    if action == "prune":
        assert age is not None
        return [await prune_hooks(pool, conninfo, age)]
    assert hook is not None
    if action == "forget":
        return [await forget_hook(pool, conninfo, hook)]
    assert from_event is not None
    return [await replay_hook(pool, hook, from_event)]


async def _memory_failures(config: AssistantConfig) -> int:
    """Print the memory extraction jobs that gave up (`bastion.memory.failed_extractions`)."""
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from bastion.assistant.database import open_database
    from bastion.memory import failed_extractions

    database = await open_database(
        database_url=config.database_url, app_database_url=config.app_database_url, data_dir=config.data_dir
    )
    try:
        async with AsyncConnectionPool(
            database.app_conninfo, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
        ) as pool:
            failed = await failed_extractions(pool)
    except psycopg.Error as error:
        return _could_not_finish("memory failures", error)
    finally:
        database.close()
    if not failed:
        print("No memory extraction job gave up.")
    for job in failed:
        print(f"{job.ended_at:%Y-%m-%d %H:%M:%S%z}  {job.status}  memory={job.memory}  run={job.run_id}")
    return 0


async def _mcp(
    config: AssistantConfig, action: str, change: int | None, application: str, status: str
) -> int:
    import getpass

    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from bastion.assistant.database import open_database
    from bastion.mcp.tool_pins import changes_report
    from bastion.stores.tool_pins import PostgresToolPins

    if action != "changes" and change is None:
        _progress(f"{action} needs the change's id, e.g. bastion mcp {action} 12")
        return 2
    database = await open_database(
        database_url=config.database_url, app_database_url=config.app_database_url, data_dir=config.data_dir
    )
    try:
        async with AsyncConnectionPool(
            database.app_conninfo, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
        ) as pool:
            pins = PostgresToolPins(pool, application=application)
            if action == "changes":
                print(
                    "\n".join(changes_report(await pins.changes(status=None if status == "all" else status)))
                )
                return 0
            assert change is not None
            if not await pins.decide(
                change, approve=action == "approve", by=f"{getpass.getuser()} (command line)"
            ):
                _progress(f"tool_change_not_found: no open change {change} for {application}.")
                return 2
    except psycopg.Error as error:
        return _could_not_finish(f"mcp {action}", error)
    finally:
        database.close()
    _progress(f"change {change} {'approved' if action == 'approve' else 'refused'}.")
    return 0


def _could_not_finish(command: str, error: Exception) -> int:
    """The operator's own database refused: its message is theirs to read (its first line, no traceback)."""
    said = (str(error).strip().splitlines() or [""])[0]
    _progress(f"{command} could not finish; the database said {type(error).__name__}: {said}")
    return 1


def _token(config: AssistantConfig, user: str) -> int:
    from bastion.assistant.dev_auth import InvalidUserNameError
    from bastion.assistant.server import development_sign_in

    try:
        print(development_sign_in(config).issue_token(user))
    except InvalidUserNameError as error:
        _progress(str(error))
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

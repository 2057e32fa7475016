"""The `bastion` command."""

from __future__ import annotations

import argparse
import sys

from bastion import __version__


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the chosen subcommand."""
    parser = argparse.ArgumentParser(prog="bastion", description="Serve AI agents over HTTP.")
    parser.add_argument("--version", action="version", version=f"bastion {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the reference assistant")
    args = parser.parse_args(argv)
    if args.command == "serve":
        print(
            "bastion serve: the reference assistant is not built yet; "
            "the framework is importable as `bastion`.",
            file=sys.stderr,
        )
        return 2
    return 0  # pragma: no cover - argparse requires a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

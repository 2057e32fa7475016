"""Starting the assistant: configuration errors that say the fix, development sign-in, the demo model and the
`bastion` command."""

from __future__ import annotations

import base64
import re
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest

from bastion import define_agent, tool
from bastion.assistant.config import AssistantConfig, ConfigError, resolve_model
from bastion.assistant.demo_model import DEMO_NOTICE, demo_model
from bastion.assistant.demo_replies import LONG_ANSWER, MARKDOWN_SAMPLE
from bastion.assistant.dev_auth import DevelopmentSignIn, InvalidUserNameError
from bastion.assistant.remote import credentials_keyring
from bastion.assistant.server import supabase_env
from bastion.auth import TokenVerifier
from bastion.stores import FollowerLimits
from tests.scripted import collect, user

USER_MCP = {
    "BASTION_MCP_URL": "http://127.0.0.1:9/mcp",
    "BASTION_MCP_TOOLS": "search",
    "BASTION_MCP_AUTH": "user",
}


def test_defaults_need_no_configuration() -> None:
    config = AssistantConfig.from_env({})
    assert (config.host, config.port, config.database_url, config.model) == ("127.0.0.1", 8000, None, None)
    assert config.loopback


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"BASTION_PORT": "eighty"}, "BASTION_PORT must be a number"),
        ({"BASTION_PORT": "70000"}, "between 1 and 65535"),
        ({"BASTION_HISTORY_WINDOW": "0"}, "BASTION_HISTORY_WINDOW must be a positive whole number"),
        ({"BASTION_MODEL_BASE_URL": "http://127.0.0.1:11434/v1"}, "needs BASTION_MODEL"),
        ({"BASTION_APP_DATABASE_URL": "postgresql://app@/db"}, "needs DATABASE_URL"),
        ({**USER_MCP, "BASTION_MCP_AUTH": "both"}, "BASTION_MCP_AUTH must be 'app' or 'user'"),
        ({"BASTION_MCP_AUTH": "user"}, "BASTION_MCP_AUTH=user needs BASTION_MCP_URL"),
        ({**USER_MCP, "BASTION_MCP_TOKEN": "app-token"}, "unset one of them"),
        ({"BASTION_RETAIN_EVENTS": "30 days"}, "BASTION_RETAIN_EVENTS must be an age such as 7d"),
        ({"BASTION_DRAIN_SECONDS": "-1"}, "BASTION_DRAIN_SECONDS must be a number of seconds"),
        ({"BASTION_DRAIN_SECONDS": "30s"}, "BASTION_DRAIN_SECONDS must be a number of seconds"),
        ({"BASTION_MAX_FOLLOWERS_PER_USER": "0"}, "BASTION_MAX_FOLLOWERS_PER_USER must be a positive"),
        ({"BASTION_MAX_FOLLOWERS_PER_TURN": "many"}, "BASTION_MAX_FOLLOWERS_PER_TURN must be a positive"),
    ],
)
def test_bad_settings_name_the_variable_and_the_fix(environ: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        AssistantConfig.from_env(environ)


def test_retention_ages_default_and_are_set_by_age() -> None:
    assert AssistantConfig.from_env({}).retain_events == timedelta(days=30)
    config = AssistantConfig.from_env({"BASTION_RETAIN_TURNS": "12h", "BASTION_RETAIN_INBOX_JOBS": "90m"})
    assert (config.retain_turns, config.retain_inbox_jobs) == (timedelta(hours=12), timedelta(minutes=90))


def test_the_drain_deadline_defaults_to_thirty_seconds_and_may_be_zero() -> None:
    assert AssistantConfig.from_env({}).drain_seconds == 30.0
    assert AssistantConfig.from_env({"BASTION_DRAIN_SECONDS": "0"}).drain_seconds == 0.0
    assert AssistantConfig.from_env({"BASTION_DRAIN_SECONDS": "12.5"}).drain_seconds == 12.5


def test_follower_caps_default_and_are_set_by_count() -> None:
    assert AssistantConfig.from_env({}).follower_limits() == FollowerLimits(per_user=20, per_turn=10)
    caps = {"BASTION_MAX_FOLLOWERS_PER_USER": "3", "BASTION_MAX_FOLLOWERS_PER_TURN": "2"}
    config = AssistantConfig.from_env(caps)
    assert config.follower_limits() == FollowerLimits(per_user=3, per_turn=2)


def test_an_unknown_model_name_says_what_to_use_instead() -> None:
    config = AssistantConfig.from_env({"BASTION_MODEL": "nonsense:model"})
    with pytest.raises(ConfigError, match=r"openai:gpt-5\.4-nano"):
        resolve_model(config)


def test_no_model_means_the_demo_model() -> None:
    assert resolve_model(AssistantConfig.from_env({})) is None


@pytest.mark.parametrize(
    ("configured", "served"),
    [
        ("llama3", "llama3"),
        ("openai:llama3", "llama3"),
        ("openai-chat:qwen3", "qwen3"),
        ("llama3:8b", "llama3:8b"),
    ],
)
def test_an_openai_compatible_base_url_gives_the_name_that_server_knows(configured: str, served: str) -> None:
    config = AssistantConfig.from_env(
        {"BASTION_MODEL": configured, "BASTION_MODEL_BASE_URL": "http://127.0.0.1:1/v1"}
    )
    model = resolve_model(config)
    assert model is not None and model.model_name == served


def test_development_sign_in_needs_a_loopback_host() -> None:
    with pytest.raises(ConfigError, match="SUPABASE_URL"):
        supabase_env(AssistantConfig.from_env({"BASTION_HOST": "0.0.0.0"}))


def test_supabase_settings_replace_development_sign_in(tmp_path: Path) -> None:
    env, sign_in = supabase_env(
        AssistantConfig.from_env(
            {"SUPABASE_URL": "https://ref.supabase.co", "BASTION_DATA_DIR": str(tmp_path)}
        )
    )
    assert sign_in is None
    assert env.issuer == "https://ref.supabase.co/auth/v1"
    assert not (tmp_path / "dev-signing-key.pem").exists()


def _dockerfile_environment() -> dict[str, str]:
    """The variables the Dockerfile's ENV sets (`NAME=value` pairs, continued with backslashes)."""
    text = (Path(__file__).parent.parent / "Dockerfile").read_text()
    env_block = re.search(r"^ENV ((?:.*\\\n)*.*)$", text, re.MULTILINE)
    assert env_block is not None
    return dict(re.findall(r"([A-Z_]+)=(\S+)", env_block.group(1)))


def test_the_container_listens_beyond_loopback_with_supabase_sign_in(tmp_path: Path) -> None:
    environ = _dockerfile_environment()
    assert environ["BASTION_HOST"] == "0.0.0.0"
    with pytest.raises(ConfigError, match="SUPABASE_URL"):
        supabase_env(AssistantConfig.from_env({**environ, "BASTION_DATA_DIR": str(tmp_path)}))
    config = AssistantConfig.from_env(
        {**environ, "BASTION_DATA_DIR": str(tmp_path), "SUPABASE_URL": "https://ref.supabase.co"}
    )
    env, sign_in = supabase_env(config)
    assert (config.host, config.port, sign_in) == ("0.0.0.0", 8000, None)
    assert env.issuer == "https://ref.supabase.co/auth/v1"


def test_users_mcp_credentials_under_supabase_sign_in_need_a_credentials_key(tmp_path: Path) -> None:
    config = AssistantConfig.from_env(
        {**USER_MCP, "SUPABASE_URL": "https://ref.supabase.co", "BASTION_DATA_DIR": str(tmp_path)}
    )
    with pytest.raises(ConfigError, match="BASTION_CREDENTIALS_KEY"):
        credentials_keyring(config)
    assert list(tmp_path.iterdir()) == []


def test_development_sign_in_generates_the_credentials_key_once(tmp_path: Path) -> None:
    config = AssistantConfig.from_env({**USER_MCP, "BASTION_DATA_DIR": str(tmp_path)})
    keys, generated = credentials_keyring(config)
    again, generated_again = credentials_keyring(config)
    assert (generated, generated_again) == (True, False)
    assert again.current_key_id == keys.current_key_id
    assert (tmp_path / "credentials-key").stat().st_mode & 0o077 == 0


def test_a_set_credentials_key_is_used_and_nothing_is_generated(tmp_path: Path) -> None:
    key = base64.b64encode(bytes(32)).decode()
    config = AssistantConfig.from_env(
        {**USER_MCP, "BASTION_DATA_DIR": str(tmp_path), "BASTION_CREDENTIALS_KEY": f"first:{key}"}
    )
    keys, generated = credentials_keyring(config)
    assert (keys.current_key_id, generated) == ("first", False)
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_credentials_key_names_the_variable_without_its_value(tmp_path: Path) -> None:
    config = AssistantConfig.from_env(
        {**USER_MCP, "BASTION_DATA_DIR": str(tmp_path), "BASTION_CREDENTIALS_KEY": "not-a-key"}
    )
    with pytest.raises(ConfigError, match="BASTION_CREDENTIALS_KEY") as raised:
        credentials_keyring(config)
    assert "not-a-key" not in str(raised.value)


def test_the_credentials_key_stays_out_of_the_config_repr() -> None:
    key = base64.b64encode(bytes(32)).decode()
    config = AssistantConfig.from_env({**USER_MCP, "BASTION_CREDENTIALS_KEY": key})
    assert key not in repr(config)


async def test_development_tokens_pass_the_real_verifier_and_survive_a_restart(tmp_path: Path) -> None:
    config = AssistantConfig(data_dir=tmp_path)
    env, sign_in = supabase_env(config)
    assert sign_in is not None
    token = sign_in.issue_token("Ada")
    principal = await TokenVerifier(env).verify(token)
    assert principal.id == DevelopmentSignIn.user_id("ada")
    assert principal.email == "ada@localhost"
    restarted, _ = supabase_env(config)
    assert (await TokenVerifier(restarted).verify(token)).id == principal.id
    assert (tmp_path / "dev-signing-key.pem").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("name", ["", "../admin", "a b", "-ada", "x" * 64, "ädа"])
def test_development_user_names_are_plain(tmp_path: Path, name: str) -> None:
    sign_in = DevelopmentSignIn(data_dir=tmp_path, issuer="http://127.0.0.1:8000/auth/v1")
    with pytest.raises(InvalidUserNameError):
        sign_in.issue_token(name)


def test_a_development_token_carries_supabase_claims(tmp_path: Path) -> None:
    sign_in = DevelopmentSignIn(data_dir=tmp_path, issuer="http://127.0.0.1:8000/auth/v1")
    claims = jwt.decode(sign_in.issue_token("ada"), options={"verify_signature": False})
    assert claims["aud"] == claims["role"] == "authenticated"
    assert claims["iss"] == "http://127.0.0.1:8000/auth/v1"
    assert claims["exp"] - claims["iat"] == 3600


def demo_tools(context: Any) -> list[Any]:
    @tool
    async def get_identity() -> dict[str, str]:
        """Who the user is."""
        return {"user_id": "u1"}

    @tool(needs_approval=True)
    async def save_note(text: str) -> dict[str, str]:
        """Save a note."""
        return {"text": text}

    @tool
    async def list_notes() -> dict[str, list[str]]:
        """List notes."""
        return {"notes": []}

    return [get_identity, save_note, list_notes]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("who am I?", "tool-output-available"),
        ("remember that the launch is on Friday", "tool-approval-request"),
        ("show my notes", "tool-output-available"),
        ("hello", "text-delta"),
    ],
)
async def test_the_demo_model_walks_the_real_paths(prompt: str, expected: str) -> None:
    agent = define_agent(name="demo", instructions="", tools=demo_tools)
    session = await agent.prepare(context=None)
    chunks = await collect(await session.stream(model=demo_model(), messages=[user(prompt)]))
    kinds = [chunk["type"] for chunk in chunks]
    assert expected in kinds
    text = "".join(chunk["delta"] for chunk in chunks if chunk["type"] == "text-delta")
    if expected != "tool-approval-request":
        assert DEMO_NOTICE in text


def bastion(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bastion.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_bastion_token_prints_a_token_for_scripts(tmp_path: Path) -> None:
    done = bastion("token", "ada", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert jwt.decode(done.stdout.strip(), options={"verify_signature": False})["email"] == "ada@localhost"


async def test_a_token_from_bastion_token_works_with_a_server_on_another_port(tmp_path: Path) -> None:
    done = bastion("token", "ada", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for port in ("8000", "9123"):
        config = AssistantConfig.from_env({"BASTION_PORT": port, "BASTION_DATA_DIR": str(tmp_path)})
        env, _ = supabase_env(config)
        principal = await TokenVerifier(env).verify(done.stdout.strip())
        assert principal.id == DevelopmentSignIn.user_id("ada")


@pytest.mark.parametrize("command", ["token", "migrate"])
def test_commands_that_do_not_listen_take_no_listening_address(tmp_path: Path, command: str) -> None:
    help_text = bastion(command, "--help", cwd=tmp_path).stdout
    assert "--data-dir" in help_text
    assert "listen" not in help_text


def test_bastion_token_refuses_a_bad_user_name(tmp_path: Path) -> None:
    done = bastion("token", "../x", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert "letters, digits" in done.stderr


def test_bastion_serve_says_when_the_port_is_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        done = bastion("serve", "--port", str(port), "--data-dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert f"Port {port} on 127.0.0.1 is in use" in done.stderr
    assert f"--port {port + 1}" in done.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "postgres").exists()


def test_bastion_serve_says_when_the_database_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-m", "bastion.cli", "migrate", "--data-dir", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": f"postgresql://nobody@127.0.0.1:{port}/db"},
    )
    assert done.returncode == 2
    assert "Cannot reach the database in DATABASE_URL" in done.stderr
    assert "unset DATABASE_URL" in done.stderr


async def demo_text(prompt: str, tools: Any = demo_tools, **settings: Any) -> str:
    agent = define_agent(name="demo", instructions="", tools=tools)
    session = await agent.prepare(context=None)
    chunks = await collect(await session.stream(model=demo_model(**settings), messages=[user(prompt)]))
    return "".join(chunk["delta"] for chunk in chunks if chunk["type"] == "text-delta")


async def test_the_demo_model_shows_markdown_and_a_long_answer_on_request() -> None:
    shown = await demo_text("show me markdown")
    assert shown == MARKDOWN_SAMPLE
    for piece in ("## ", "\n- ", "| Part | Where it lives |", "```python\n"):
        assert piece in shown
    long = await demo_text("explain bastion in detail", word_delay=0)
    assert long == LONG_ANSWER and len(long.split()) > 300
    assert await demo_text("write a long story", word_delay=0) == LONG_ANSWER


async def test_the_demo_model_tells_tool_results_in_words() -> None:
    said = await demo_text("who am I?")
    assert "You are signed in as the user u1" in said
    assert "{" not in said and "returned" not in said
    assert "You have no notes yet" in await demo_text("show my notes")


async def test_the_demo_model_suggests_what_fits_where_it_runs() -> None:
    assert "“show my notes”" in await demo_text("hello")

    def support_tools(context: Any) -> list[Any]:
        @tool
        async def handoff_to_human(reason: str) -> dict[str, bool]:
            """Hand the conversation to staff."""
            return {"handed_off": True}

        return [handoff_to_human]

    in_widget = await demo_text("hello", support_tools)
    assert "talk to a person" in in_widget and "notes" not in in_widget

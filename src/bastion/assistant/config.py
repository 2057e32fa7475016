"""The reference assistant's configuration, read once from the environment with errors that say the fix."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic_ai.models import Model

from bastion._extras import missing_extra
from bastion.stores.followers import DEFAULT_FOLLOWER_LIMITS, FollowerLimits

if TYPE_CHECKING:
    from bastion.memory import Embedder

__all__ = ["AssistantConfig", "ConfigError", "resolve_embedder", "resolve_model"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_DATA_DIR = ".bastion"
DEFAULT_HISTORY_WINDOW = 50
MCP_AUTH_MODES = ("app", "user", "oauth")
# How long retention keeps what is finished (see bastion.retention).
DEFAULT_RETAIN_TURNS = timedelta(days=7)
DEFAULT_RETAIN_INBOX_JOBS = timedelta(days=7)
DEFAULT_RETAIN_EVENTS = timedelta(days=30)
# How long a server told to stop (SIGTERM) lets its running turns finish (see bastion.drain).
DEFAULT_DRAIN_SECONDS = 30.0


class ConfigError(ValueError):
    """A setting is missing or wrong; the message names the variable and what to try."""

    code = "configuration_error"


@dataclass(frozen=True, kw_only=True)
class AssistantConfig:
    """Everything the assistant reads from its environment. Secrets stay out of `repr`."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    data_dir: Path = field(default_factory=lambda: Path(DEFAULT_DATA_DIR))
    database_url: str | None = field(default=None, repr=False)
    app_database_url: str | None = field(default=None, repr=False)
    model: str | None = None
    model_base_url: str | None = None
    model_api_key: str | None = field(default=None, repr=False)
    supabase_url: str | None = None
    supabase_publishable_key: str | None = field(default=None, repr=False)
    supabase_secret_key: str | None = field(default=None, repr=False)
    supabase_jwt_secret: str | None = field(default=None, repr=False)
    mcp_url: str | None = None
    mcp_transport: str = "http"
    mcp_tools: tuple[str, ...] = ()
    mcp_token: str | None = field(default=None, repr=False)
    mcp_auth: str = "app"
    credentials_key: str | None = field(default=None, repr=False)
    history_window: int = DEFAULT_HISTORY_WINDOW
    embedding_model: str | None = None
    embedding_dimensions: int | None = None
    embedding_base_url: str | None = None
    embedding_api_key: str | None = field(default=None, repr=False)
    inbox_secret: str | None = field(default=None, repr=False)
    inbox_token_secret: str | None = field(default=None, repr=False)
    durable: bool = True
    hooks: bool = True
    retain_turns: timedelta = DEFAULT_RETAIN_TURNS
    retain_inbox_jobs: timedelta = DEFAULT_RETAIN_INBOX_JOBS
    retain_events: timedelta = DEFAULT_RETAIN_EVENTS
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    max_followers_per_user: int = DEFAULT_FOLLOWER_LIMITS.per_user
    max_followers_per_turn: int = DEFAULT_FOLLOWER_LIMITS.per_turn

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> AssistantConfig:
        """Read the settings; `overrides` (from command-line flags) win over the environment."""
        env = os.environ if environ is None else environ

        def text(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        values: dict[str, object] = {
            "host": text("BASTION_HOST") or DEFAULT_HOST,
            "port": _port(text("BASTION_PORT")),
            "data_dir": Path(text("BASTION_DATA_DIR") or DEFAULT_DATA_DIR),
            "database_url": text("DATABASE_URL"),
            "app_database_url": text("BASTION_APP_DATABASE_URL"),
            "model": text("BASTION_MODEL"),
            "model_base_url": text("BASTION_MODEL_BASE_URL"),
            "model_api_key": text("BASTION_MODEL_API_KEY"),
            "supabase_url": text("SUPABASE_URL"),
            "supabase_publishable_key": text("SUPABASE_PUBLISHABLE_KEY"),
            "supabase_secret_key": text("SUPABASE_SECRET_KEY"),
            "supabase_jwt_secret": text("SUPABASE_JWT_SECRET"),
            "mcp_url": text("BASTION_MCP_URL"),
            "mcp_transport": text("BASTION_MCP_TRANSPORT") or "http",
            "mcp_tools": tuple(
                name.strip() for name in (text("BASTION_MCP_TOOLS") or "").split(",") if name.strip()
            ),
            "mcp_token": text("BASTION_MCP_TOKEN"),
            "mcp_auth": text("BASTION_MCP_AUTH") or "app",
            "credentials_key": text("BASTION_CREDENTIALS_KEY"),
            "history_window": _positive_int("BASTION_HISTORY_WINDOW", text("BASTION_HISTORY_WINDOW"))
            or DEFAULT_HISTORY_WINDOW,
            "embedding_model": text("BASTION_EMBEDDING_MODEL"),
            "embedding_dimensions": _positive_int(
                "BASTION_EMBEDDING_DIMENSIONS", text("BASTION_EMBEDDING_DIMENSIONS")
            ),
            "embedding_base_url": text("BASTION_EMBEDDING_BASE_URL"),
            "embedding_api_key": text("BASTION_EMBEDDING_API_KEY"),
            "inbox_secret": text("BASTION_INBOX_SECRET"),
            "inbox_token_secret": text("BASTION_INBOX_TOKEN_SECRET"),
            "durable": _switch("BASTION_DURABLE", text("BASTION_DURABLE"), default=True),
            "hooks": _switch("BASTION_HOOKS", text("BASTION_HOOKS"), default=True),
            "retain_turns": _age("BASTION_RETAIN_TURNS", text("BASTION_RETAIN_TURNS"))
            or DEFAULT_RETAIN_TURNS,
            "retain_inbox_jobs": _age("BASTION_RETAIN_INBOX_JOBS", text("BASTION_RETAIN_INBOX_JOBS"))
            or DEFAULT_RETAIN_INBOX_JOBS,
            "retain_events": _age("BASTION_RETAIN_EVENTS", text("BASTION_RETAIN_EVENTS"))
            or DEFAULT_RETAIN_EVENTS,
            "drain_seconds": _seconds(
                "BASTION_DRAIN_SECONDS", text("BASTION_DRAIN_SECONDS"), DEFAULT_DRAIN_SECONDS
            ),
            "max_followers_per_user": _positive_int(
                "BASTION_MAX_FOLLOWERS_PER_USER", text("BASTION_MAX_FOLLOWERS_PER_USER")
            )
            or DEFAULT_FOLLOWER_LIMITS.per_user,
            "max_followers_per_turn": _positive_int(
                "BASTION_MAX_FOLLOWERS_PER_TURN", text("BASTION_MAX_FOLLOWERS_PER_TURN")
            )
            or DEFAULT_FOLLOWER_LIMITS.per_turn,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        config = cls(**values)  # type: ignore[arg-type]
        config.validate()
        return config

    def follower_limits(self) -> FollowerLimits:
        """How many streams may follow running turns at once in this process (`GET …/stream`)."""
        return FollowerLimits(per_user=self.max_followers_per_user, per_turn=self.max_followers_per_turn)

    def validate(self) -> None:
        if self.inbox_secret is not None and len(self.inbox_secret) < 16:
            raise ConfigError(
                "BASTION_INBOX_SECRET, the inbox webhook's bearer secret, needs 16 characters or more."
            )
        if self.inbox_token_secret is not None and len(self.inbox_token_secret.encode()) < 32:
            raise ConfigError(
                "BASTION_INBOX_TOKEN_SECRET, which signs contact tokens, needs 32 bytes or more."
            )
        if not 0 < self.port < 65536:
            raise ConfigError(f"BASTION_PORT must be between 1 and 65535, not {self.port}.")
        if self.app_database_url is not None and self.database_url is None:
            raise ConfigError("BASTION_APP_DATABASE_URL needs DATABASE_URL, which runs the migrations.")
        if self.mcp_transport not in ("http", "sse"):
            raise ConfigError(f"BASTION_MCP_TRANSPORT must be 'http' or 'sse', not {self.mcp_transport!r}.")
        if self.mcp_url is not None and not self.mcp_tools:
            raise ConfigError(
                "BASTION_MCP_URL needs BASTION_MCP_TOOLS, the comma-separated remote tools the assistant "
                "may use: tools a server adds later are never exposed."
            )
        if self.mcp_auth not in MCP_AUTH_MODES:
            raise ConfigError(
                "BASTION_MCP_AUTH must be 'app' or 'user' (a pasted token), or 'oauth' (each user signs "
                f"in), not {self.mcp_auth!r}."
            )
        if self.mcp_auth != "app" and self.mcp_url is None:
            raise ConfigError(
                f"BASTION_MCP_AUTH={self.mcp_auth} needs BASTION_MCP_URL, the server users connect to."
            )
        if self.mcp_auth != "app" and self.mcp_token is not None:
            raise ConfigError(
                f"BASTION_MCP_TOKEN is the app's credential, but BASTION_MCP_AUTH={self.mcp_auth} sends each "
                "user's own: unset one of them."
            )
        if self.mcp_auth == "oauth" and self.mcp_transport != "http":
            raise ConfigError("BASTION_MCP_AUTH=oauth signs users in to a streamable HTTP server only.")
        if self.model_base_url is not None and self.model is None:
            raise ConfigError("BASTION_MODEL_BASE_URL needs BASTION_MODEL, the model name the server knows.")
        embedding_settings = (self.embedding_dimensions, self.embedding_base_url, self.embedding_api_key)
        if self.embedding_model is None and any(value is not None for value in embedding_settings):
            raise ConfigError(
                "BASTION_EMBEDDING_DIMENSIONS, _BASE_URL and _API_KEY need BASTION_EMBEDDING_MODEL, "
                "the embedding model's name."
            )
        if self.embedding_model is not None and self.embedding_dimensions is None:
            raise ConfigError(
                "BASTION_EMBEDDING_MODEL needs BASTION_EMBEDDING_DIMENSIONS, the length of its vectors "
                "(1536 for text-embedding-3-small)."
            )

    @property
    def loopback(self) -> bool:
        """Whether the server only listens on this machine (development sign-in needs it)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


_OPENAI_PREFIXES = ("openai:", "openai-chat:")


def _port(value: str | None) -> int:
    if value is None:
        return DEFAULT_PORT
    if not value.isdigit():
        raise ConfigError(f"BASTION_PORT must be a number, not {value!r}.")
    return int(value)


def _switch(name: str, value: str | None, *, default: bool) -> bool:
    if value is None:
        return default
    if value.lower() in ("1", "on", "true", "yes"):
        return True
    if value.lower() in ("0", "off", "false", "no"):
        return False
    raise ConfigError(f"{name} must be on or off, not {value!r}.")


def _age(name: str, value: str | None) -> timedelta | None:
    if value is None:
        return None
    from bastion.hooks.report import parse_age  # the ages `bastion hooks prune` reads; needs DBOS

    try:
        return parse_age(value)
    except ValueError:
        raise ConfigError(f"{name} must be an age such as 7d, 12h, 45m or 90s, not {value!r}.") from None


def _seconds(name: str, value: str | None, default: float) -> float:
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"{name} must be a number of seconds (0 or more), not {value!r}.")
    return seconds


def _positive_int(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{name} must be a positive whole number, not {value!r}.")
    return int(value)


def _served_model_name(model: str) -> str:
    """The name an OpenAI-compatible server knows: `openai:qwen3` is `qwen3` (but `llama3:8b` stays)."""
    for prefix in _OPENAI_PREFIXES:
        if model.startswith(prefix) and len(model) > len(prefix):
            return model[len(prefix) :]
    return model


def resolve_embedder(config: AssistantConfig) -> Embedder | None:
    """The configured OpenAI-compatible embeddings endpoint, or None (the offline or lexical default)."""
    if config.embedding_model is None or config.embedding_dimensions is None:
        return None
    from bastion.memory import OpenAIEmbedder

    return OpenAIEmbedder(
        model=config.embedding_model,
        dimensions=config.embedding_dimensions,
        base_url=config.embedding_base_url or "https://api.openai.com/v1",
        api_key=config.embedding_api_key,
    )


def resolve_model(config: AssistantConfig) -> Model | None:
    """The configured model, or None for the offline demo model. Errors say which variable to fix."""
    if config.model is None:
        return None
    if config.model_base_url is not None:
        try:
            from pydantic_ai.models.openai import OpenAIChatModel
            from pydantic_ai.providers.openai import OpenAIProvider
        except ImportError as error:
            raise missing_extra("BASTION_MODEL_BASE_URL", "openai", error) from error

        provider = OpenAIProvider(
            base_url=config.model_base_url, api_key=config.model_api_key or "not-needed"
        )
        return OpenAIChatModel(_served_model_name(config.model), provider=provider)
    from pydantic_ai.exceptions import UserError

    from bastion._extras import infer_model

    try:
        return infer_model(config.model)
    except UserError as error:
        raise ConfigError(
            f"BASTION_MODEL={config.model!r} cannot be used: {error} "
            "Use a pydantic-ai model name such as 'openai:gpt-5.4-nano' with its provider's key variable, "
            "or unset BASTION_MODEL for the offline demo model."
        ) from None
    except ImportError as error:
        raise ConfigError(f"BASTION_MODEL={config.model!r} needs a provider package. {error}") from None

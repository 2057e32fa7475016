"""Every public name of before the `bastion.chat` move still imports from where it was.

`PUBLIC_BEFORE` is each public module's `__all__` as it was before the move, and `README_BEFORE` the
imports the README showed; both were collected from the tree before anything moved. A name that moved
warns (`DeprecationWarning`) naming its new place and is the very object found there; every other
name imports without a warning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import pytest

PUBLIC_BEFORE: dict[str, str] = {
    "bastion": (
        "Agent AgentApprovalAuthorizationError AgentCancelledError AgentHistoryConflictError "
        "AgentMessagesInvalidError AgentPersistence AgentRun AgentRunInactiveError AgentSession "
        "AgentSessionClosedError AgentStreamResult AgentTools ApprovalDecision BastionError CallOrigin "
        "DuplicateToolNameError ExecuteToolHook InvalidUIMessageChunkError MissingExtraError RunInput "
        "RunOutcome RunStart RunStatus Skill SkillCatalog TokenUsage Tool ToolCall ToolDenial ToolError "
        "ToolExecutionNotConfiguredError ToolInputError ToolOperation ToolPolicy __version__ "
        "assemble_ui_messages compose_tools create_skill_catalog define_agent reconcile_agent_messages "
        "sanitize_tool_error_for_model sanitize_tool_output sanitize_tool_output_for_model "
        "start_agent_run tool with_tool_policy"
    ),
    "bastion.agent": "Agent AgentSession AgentSessionClosedError AgentTools define_agent",
    "bastion.api": (
        "EventStream InvalidRequestError MAX_JSON_DEPTH OperationSpec PlainBody StrictModel json_body "
        "json_response openapi_document operation"
    ),
    "bastion.approvals": (
        "AgentApprovalAuthorizationError ApprovalDecision CanRespondToApproval authorize_approval_decision"
    ),
    "bastion.assistant.agent": "AssistantContext NoteBook assistant_agent",
    "bastion.assistant.app": "AssistantApp build_routes",
    "bastion.assistant.config": "AssistantConfig ConfigError resolve_embedder resolve_model",
    "bastion.assistant.database": "APP_ROLE Database DatabaseError grant_app_role_of migrate open_database",
    "bastion.assistant.demo_model": "DEMO_NOTICE demo_model",
    "bastion.assistant.dev_auth": "DevelopmentSignIn InvalidSessionError InvalidUserNameError",
    "bastion.assistant.hooks": "FINISHED_RUNS assistant_hooks usage_counter",
    "bastion.assistant.notes": "PostgresNoteBook",
    "bastion.assistant.remote": (
        "CREDENTIALS_KEY_FILE ConnectionFailedError ConnectionNeedsAuthorizationError "
        "CredentialsUnavailableError UserCredentials credentials_keyring remote_tool_names remote_tools"
    ),
    "bastion.assistant.schemas": (
        "AuthConfig ConnectionStatus ConnectionToken DevelopmentAuthSettings DevelopmentAuthUser "
        "DevelopmentGrant DevelopmentGrantQuery DevelopmentSession DevelopmentToken "
        "DevelopmentTokenRequest DevelopmentUser Health Info"
    ),
    "bastion.assistant.server": "RunningAssistant development_sign_in running_assistant serve supabase_env",
    "bastion.assistant.support": "INBOX_CHANNEL INBOX_TENANT inbox_settings inbox_staff support_agent",
    "bastion.auth": (
        "AuthenticationError AuthenticationErrorCode KeySetUnavailableError Principal SupabaseEnv "
        "TokenVerifier bearer_token"
    ),
    "bastion.chat_request": (
        "ChatRequest UIMessage UIMessagePart UI_MESSAGE_CHUNK UI_MESSAGE_STREAM_END UUID_PATTERN"
    ),
    "bastion.client": (
        "BastionApiError BastionClient BastionStreamError Conversation ConversationPage TokenSource "
        "UIMessageChunk user_message"
    ),
    "bastion.credentials": (
        "ConnectionAuthorizationFailedError ConnectionAuthorizationRequiredError CredentialError "
        "CredentialForbiddenError CredentialInvalidError CredentialProvider CredentialRef CredentialScope "
        "CredentialStorageError CredentialUnauthorizedError EnvironmentCredentialProvider "
        "InMemoryCredentialProvider check_credential_owner credential_auth"
    ),
    "bastion.durable": (
        "DURABLE_APPLICATION_VERSION DURABLE_SCHEMA DurableEngine DurableEngineError DurableTurnError "
        "DurableTurns migrate_durable prune_finished_turns system_database_url turn_workflow_id"
    ),
    "bastion.durable.engine": (
        "DURABLE_APPLICATION_VERSION DURABLE_SCHEMA DurableEngine DurableEngineError migrate_durable "
        "system_database_url"
    ),
    "bastion.durable.turns": "DurableTurnError DurableTurns prune_finished_turns turn_workflow_id",
    "bastion.errors": "BastionError ToolError",
    "bastion.history": (
        "AgentHistoryConflictError AgentMessagesInvalidError REGENERATE_MESSAGE SUBMIT_MESSAGE "
        "check_agent_messages check_trigger reconcile_agent_messages"
    ),
    "bastion.hooks": (
        "BatchHandler EVENT_TYPES EventIdsHandler EventWindow FailedDelivery ForgottenDeliveries "
        "ForgottenHook Hook HookDelivery HookEvent HookEventPruned HookFailure HookHandler HookRegistry "
        "HookStatus PERSIST_SESSIONS_EVENTS PostgresHookOutbox Pruned RetryPolicy "
        "apply_chat_table_migrations apply_hooks_migrations autocommit_connection canonical_parts "
        "chat_id_of define_hook delivery_workflow_id delivery_workflow_prefix failed_deliveries "
        "failed_delivery_counts forget_deliveries hook_migrations hook_queue_name persist_sessions "
        "prune_deliveries prune_outbox queued_deliveries"
    ),
    "bastion.hooks.canonical": "canonical_parts chat_id_of",
    "bastion.hooks.delivery": (
        "CHANNEL HookDelivery delivery_workflow_id delivery_workflow_prefix hook_queue_name"
    ),
    "bastion.hooks.delivery_status": (
        "FailedDelivery failed_deliveries failed_delivery_counts queued_deliveries"
    ),
    "bastion.hooks.events": "EVENT_TYPES HookEvent",
    "bastion.hooks.outbox": (
        "EventWindow ForgottenHook HookEventPruned HookFailure HookStatus PostgresHookOutbox "
        "apply_chat_table_migrations apply_hooks_migrations autocommit_connection hook_migrations"
    ),
    "bastion.hooks.registry": (
        "BatchHandler EventIdsHandler Hook HookHandler HookRegistry RetryPolicy define_hook"
    ),
    "bastion.hooks.report": "failures_report forget_hook parse_age prune_hooks replay_hook status_report",
    "bastion.hooks.retention": "ForgottenDeliveries Pruned forget_deliveries prune_deliveries prune_outbox",
    "bastion.hooks.sessions": "PERSIST_SESSIONS_EVENTS persist_sessions",
    "bastion.inbox": (
        "Author BotMode CONTACT_ROLE ChannelUnauthorizedError ContactPrincipal ContactTokenError "
        "ContactTokens InboundMessage InboxChannel InboxChannels InboxConversation InboxMessage "
        "InboxReplies InboxTurn JobOutcome NotInboxStaffError OutboundMessage PostgresInbox REPLY_QUEUE "
        "REPLY_WORKFLOW ReplyJob ReplyOutcome ReplyRouter ThreadConflictError answer_as_contact "
        "apply_inbox_migrations handoff_to_human inbox_routes reply_job_id user_only_policy"
    ),
    "bastion.inbox.channels": "InboxChannel InboxChannels",
    "bastion.inbox.entities": (
        "Author BotMode InboundMessage InboxConversation InboxMessage OutboundMessage ReplyOutcome"
    ),
    "bastion.inbox.errors": (
        "ChannelUnauthorizedError ContactTokenError NotInboxStaffError ThreadConflictError"
    ),
    "bastion.inbox.principal": "CONTACT_ROLE ContactPrincipal",
    "bastion.inbox.replies": "InboxReplies JobOutcome REPLY_QUEUE REPLY_WORKFLOW reply_job_id",
    "bastion.inbox.routes": "inbox_routes",
    "bastion.inbox.store": "MAX_MESSAGE_LENGTH PostgresInbox ReplyJob ReplyRouter apply_inbox_migrations",
    "bastion.inbox.tokens": "ContactTokens",
    "bastion.inbox.turns": "InboxTurn answer_as_contact handoff_to_human user_only_policy",
    "bastion.mcp": (
        "DEFAULT_REQUEST_TIMEOUT_MS McpConnectionDefinition McpConnectionError McpConnections "
        "McpErrorCode McpErrorReason McpTransport create_mcp_connections"
    ),
    "bastion.memory": (
        "AgentMemory DEFAULT_NEAR_DUPLICATE_THRESHOLD DEFAULT_OPERATION_TTL Embedder EmbeddingError "
        "Extractor HashingEmbedder KnowledgeChunk KnowledgeDocument MemoryDocument "
        "MemoryDocumentConflictError MemoryItem MemoryNotSupportedError MemoryUnavailableError "
        "MemoryVersion OfflineEmbedder OpenAIEmbedder PostgresMemoryDocuments PostgresMemoryStore Recall "
        "RecalledMemory RememberOutcome RememberResult apply_memory_migrations chunk_text define_memory "
        "memory_routes offline_embedder_available render_recall"
    ),
    "bastion.memory.chunking": "chunk_text",
    "bastion.memory.documents": "PostgresMemoryDocuments",
    "bastion.memory.embedders": "Embedder EmbeddingError HashingEmbedder OpenAIEmbedder",
    "bastion.memory.entities": (
        "KnowledgeChunk KnowledgeDocument MemoryDocument MemoryItem MemoryVersion Recall RecalledMemory "
        "RememberOutcome RememberResult"
    ),
    "bastion.memory.errors": "MemoryDocumentConflictError MemoryNotSupportedError MemoryUnavailableError",
    "bastion.memory.extraction": "ExtractionRunner Extractor",
    "bastion.memory.offline": "NEAR_DUPLICATE_THRESHOLD OfflineEmbedder offline_embedder_available",
    "bastion.memory.postgres": (
        "DEFAULT_NEAR_DUPLICATE_THRESHOLD DEFAULT_OPERATION_TTL PostgresMemoryStore apply_memory_migrations"
    ),
    "bastion.memory.provider": "AgentMemory define_memory render_recall",
    "bastion.memory.routes": "memory_routes",
    "bastion.memory.tools": "memory_tools",
    "bastion.persistence": (
        "AgentPersistence AgentRun AgentRunInactiveError RunInput RunOutcome RunStart RunStatus "
        "ToolExecutionNotConfiguredError ToolOperation start_agent_run"
    ),
    "bastion.policies": (
        "DEFAULT_DENIED_OUTPUT GENERIC_TOOL_ERROR REDACTED_OUTPUT ToolPolicy "
        "sanitize_tool_error_for_model sanitize_tool_output sanitize_tool_output_for_model "
        "with_tool_policy"
    ),
    "bastion.request_log": (
        "ACCESS_LOG_ENV JsonFormatter REQUEST_ID_HEADER RequestIdFilter RequestLogMiddleware "
        "access_log_enabled configure_logging request_id"
    ),
    "bastion.skills": "DEFAULT_SKILL_TOOL_NAME Skill SkillCatalog create_skill_catalog",
    "bastion.sqlalchemy": (
        "BastionTables bastion_tables caller_session exclude_bastion_tables sync_caller_session"
    ),
    "bastion.stores": (
        "AgentRunContext AgentRunResult AppColumn ApplicationRoleError ColumnKind Conversation "
        "ConversationBusyError ConversationFilter ConversationNotFoundError ConversationSchema Feedback "
        "InvalidFilterError InvalidInputError InvalidStateError Migration MigrationChangedError "
        "NotFoundError PostgresAgentPersistence PostgresStore Rating RunEvent RunStore "
        "SqliteAgentPersistence SqliteStore StoreError StoreIdentity StoredMessage "
        "ToolOperationConflictError ToolOperationError ToolOperationMismatchError "
        "ToolOperationUncertainError TurnConflictError TurnContext TurnState apply_application_migrations "
        "apply_migrations available_migrations check_storable_message conversation_cursor "
        "grant_application_role run_agent"
    ),
    "bastion.stores.chat": (
        "ChatEndpoint ChatStore ChatTurn ContextFactory DurableTurnHooks LiveTurnStore ResumeQuery "
        "StopResult chat_routes"
    ),
    "bastion.stores.credentials": (
        "CREDENTIALS_KEY_VARIABLE CredentialKeyring PostgresCredentialProvider VaultCredentialProvider"
    ),
    "bastion.stores.entities": (
        "Conversation Feedback Rating RunEvent StoreIdentity StoredMessage TurnContext TurnState"
    ),
    "bastion.stores.errors": (
        "ConversationBusyError InvalidInputError NotFoundError StoreError ToolOperationConflictError "
        "ToolOperationError ToolOperationMismatchError ToolOperationUncertainError TurnConflictError"
    ),
    "bastion.stores.filters": (
        "AppColumn ColumnKind ConversationFilter InvalidFilterError conversation_cursor"
    ),
    "bastion.stores.live": "ChunkBatch ChunkLog LiveRun LiveTurns StreamAssembly StreamSuperseded",
    "bastion.stores.postgres": "Connection PostgresAgentPersistence PostgresStore caller_transaction",
    "bastion.stores.postgres_live": "PostgresLiveTurns",
    "bastion.stores.roles": "ApplicationRoleError grant_application_role",
    "bastion.stores.routes": (
        "ConversationRules ConversationStore InvalidRequestError MessagesQuery RuleRefusedError "
        "conversation_routes json_body"
    ),
    "bastion.stores.run": "AgentRunContext AgentRunResult ConversationNotFoundError RunStore run_agent",
    "bastion.stores.schema": "ConversationSchema InvalidStateError",
    "bastion.stores.sqlite": "SqliteAgentPersistence SqliteStore available_sqlite_migrations",
    "bastion.stream": (
        "AgentStreamResponse AgentStreamResult DEFAULT_ERROR_TEXT OnFinish OnSettled StreamLog "
        "StreamStatus TurnRunner UIMessage UI_MESSAGE_STREAM_HEADERS create_agent_stream_response"
    ),
    "bastion.tools": (
        "CallOrigin DuplicateToolNameError Tool ToolCall ToolDenial ToolExecutor ToolInputError "
        "compose_tools tool"
    ),
    "bastion.versioning": "API_VERSION_HEADER ApiVersionHeader ApiVersioning DEFAULT_VERSIONING ServedPath",
    "bastion.worker": (
        "AuthMode AuthorizeHook ErrorFormatter Handler RequestContext RequestFailure Route "
        "create_agent_worker"
    ),
}

README_BEFORE: list[tuple[str, str]] = [
    ("bastion", "Agent"),
    ("bastion", "Tool"),
    ("bastion", "ToolPolicy"),
    ("bastion", "assemble_ui_messages"),
    ("bastion", "define_agent"),
    ("bastion", "tool"),
    ("bastion.durable", "DurableEngine"),
    ("bastion.hooks", "HookDelivery"),
    ("bastion.hooks", "HookRegistry"),
    ("bastion.hooks", "define_hook"),
    ("bastion.hooks", "persist_sessions"),
    ("bastion.sqlalchemy", "bastion_tables"),
    ("bastion.sqlalchemy", "caller_session"),
    ("bastion.stores", "AgentRunContext"),
    ("bastion.stores", "PostgresStore"),
    ("bastion.stores", "SqliteStore"),
    ("bastion.stores", "StoreIdentity"),
    ("bastion.stores", "run_agent"),
    ("bastion.stores.chat", "chat_routes"),
]

# Where each moved name lives now: whole modules that became shims, then single names of packages.
MOVED_MODULES = {
    "bastion.stores.chat": "bastion.chat",
    "bastion.stores.routes": "bastion.chat",
    "bastion.stores.run": "bastion.chat",
    "bastion.chat_request": "bastion.chat.request",
    "bastion.stream": "bastion.chat",
    "bastion.durable.turns": "bastion.chat.durable_turns",
    "bastion.inbox.turns": "bastion.inbox.bot_turn",
}
MOVED_NAMES = {
    ("bastion.chat_request", "ChatRequest"): "bastion.chat",
    ("bastion.chat_request", "UIMessagePart"): "bastion.chat",
    ("bastion.stream", "AgentStreamResult"): "bastion",
    ("bastion.stream", "UIMessage"): "bastion.chat.stream_response",
    ("bastion.stores.routes", "InvalidRequestError"): "bastion.api",
    ("bastion.stores.routes", "json_body"): "bastion.api",
    **{
        ("bastion.stores", name): "bastion.chat"
        for name in (
            "AgentRunContext",
            "AgentRunResult",
            "ConversationNotFoundError",
            "RunStore",
            "run_agent",
        )
    },
    **{
        ("bastion.durable", name): "bastion.chat.durable_turns"
        for name in ("DurableTurns", "prune_finished_turns")
    },
}


# Names that moved under a new name: where they live now, and as what.
RENAMED = {
    ("bastion.chat_request", "UIMessage"): ("bastion.chat.request", "WireUIMessage"),
    ("bastion.chat.request", "UIMessage"): ("bastion.chat.request", "WireUIMessage"),
}


def new_home(module: str, name: str) -> str | None:
    return MOVED_NAMES.get((module, name)) or MOVED_MODULES.get(module)


def imported(module: str, name: str) -> tuple[Any, list[str]]:
    """`from module import name`, and the deprecation warnings it raised."""
    namespace: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(f"from {module} import {name} as value", namespace)
    return namespace["value"], [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


def check(module: str, name: str) -> None:
    value, deprecations = imported(module, name)
    if (module, name) in RENAMED:
        home, new_name = RENAMED[module, name]
        warning = f"{module}.{name} was renamed: import {new_name} from {home}"
        assert deprecations and set(deprecations) == {warning}
        assert getattr(importlib.import_module(home), new_name) is value
        return
    home = new_home(module, name)
    if home is None:
        assert deprecations == [], f"{module}.{name}"
        return
    # (`from package import name` looks the name up twice: once for a submodule, once to bind it.)
    assert deprecations and set(deprecations) == {f"{module}.{name} moved: import it from {home}"}
    assert getattr(importlib.import_module(home), name) is value


@pytest.mark.parametrize("module", sorted(PUBLIC_BEFORE))
def test_every_name_of_a_public_modules_all_before_still_imports(module: str) -> None:
    names = PUBLIC_BEFORE[module].split()
    for name in names:
        check(module, name)
    # A star import still finds every name.
    assert set(names) <= set(importlib.import_module(module).__all__)


@pytest.mark.parametrize(("module", "name"), README_BEFORE)
def test_every_import_the_readme_showed_before_still_works(module: str, name: str) -> None:
    check(module, name)


def test_a_moved_module_forwards_its_other_public_names_and_refuses_unknown_ones() -> None:
    from bastion.chat import conversations as new

    value, deprecations = imported("bastion.stores.routes", "ConversationOut")
    assert value is new.ConversationOut
    assert deprecations == [
        "bastion.stores.routes.ConversationOut moved: import it from bastion.chat.conversations"
    ]
    with pytest.raises(ImportError):
        imported("bastion.stores.routes", "NoSuchName")
    with pytest.raises(ImportError):
        imported("bastion.stores", "NoSuchName")


def test_the_moved_modules_are_only_shims_left_for_old_imports() -> None:
    """Nothing inside bastion imports an old path: importing the package and its modules warns nothing."""
    import subprocess
    import sys

    modules = [m for m in PUBLIC_BEFORE if m not in MOVED_MODULES]
    code = f"import importlib\nfor m in {modules!r}: importlib.import_module(m)"
    result = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_the_request_messages_old_name_warns_and_is_the_wire_shape() -> None:
    """`bastion.chat.request.UIMessage` (the request's checked shape before its rename) still imports."""
    check("bastion.chat.request", "UIMessage")

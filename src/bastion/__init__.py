"""bastion: serve AI agents to many users over HTTP, with Postgres as the system of record.

This module is the public API; every other module's names are private unless re-exported here.
"""

from bastion._cancel import AgentCancelledError
from bastion._extras import MissingExtraError
from bastion._loop import AgentStreamResult
from bastion._telemetry import TokenUsage
from bastion._turn_plan import ExecuteToolHook
from bastion._ui_assembly import InvalidUIMessageChunkError, assemble_ui_messages
from bastion.agent import Agent, AgentSession, AgentSessionClosedError, AgentTools, define_agent
from bastion.approvals import AgentApprovalAuthorizationError, ApprovalDecision
from bastion.errors import BastionError, DatabaseUnavailableError, ToolError
from bastion.history import AgentHistoryConflictError, AgentMessagesInvalidError, reconcile_agent_messages
from bastion.persistence import (
    AgentPersistence,
    AgentRun,
    AgentRunInactiveError,
    RunInput,
    RunOutcome,
    RunStart,
    RunStatus,
    ToolExecutionNotConfiguredError,
    ToolOperation,
    start_agent_run,
)
from bastion.policies import (
    ToolPolicy,
    sanitize_tool_error_for_model,
    sanitize_tool_output,
    sanitize_tool_output_for_model,
    with_tool_policy,
)
from bastion.skills import Skill, SkillCatalog, create_skill_catalog
from bastion.tools import (
    CallOrigin,
    DuplicateToolNameError,
    Tool,
    ToolCall,
    ToolDenial,
    ToolInputError,
    compose_tools,
    tool,
)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentApprovalAuthorizationError",
    "AgentCancelledError",
    "AgentHistoryConflictError",
    "AgentMessagesInvalidError",
    "AgentPersistence",
    "AgentRun",
    "AgentRunInactiveError",
    "AgentSession",
    "AgentSessionClosedError",
    "AgentStreamResult",
    "AgentTools",
    "ApprovalDecision",
    "BastionError",
    "CallOrigin",
    "DatabaseUnavailableError",
    "DuplicateToolNameError",
    "ExecuteToolHook",
    "InvalidUIMessageChunkError",
    "MissingExtraError",
    "RunInput",
    "RunOutcome",
    "RunStart",
    "RunStatus",
    "Skill",
    "SkillCatalog",
    "TokenUsage",
    "Tool",
    "ToolCall",
    "ToolDenial",
    "ToolError",
    "ToolExecutionNotConfiguredError",
    "ToolInputError",
    "ToolOperation",
    "ToolPolicy",
    "__version__",
    "assemble_ui_messages",
    "compose_tools",
    "create_skill_catalog",
    "define_agent",
    "reconcile_agent_messages",
    "sanitize_tool_error_for_model",
    "sanitize_tool_output",
    "sanitize_tool_output_for_model",
    "start_agent_run",
    "tool",
    "with_tool_policy",
]

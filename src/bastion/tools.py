"""Tools an agent may call: their definition, input validation, and composition of tool sources.

A `Tool` is what the model sees (name, description, JSON schema) plus what the server runs. Tools are
built per turn by the agent's factory, so an executor closes over the turn's trusted context instead
of receiving it from the model.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import re
import sys
from collections import OrderedDict
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Final, TypeAlias, get_type_hints, overload

import jsonschema
import pydantic
from pydantic_ai.native_tools import AbstractNativeTool

__all__ = [
    "CallOrigin",
    "DuplicateToolNameError",
    "Tool",
    "ToolCall",
    "ToolDenial",
    "ToolExecutor",
    "ToolInputError",
    "compose_tools",
    "tool",
]

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model asked for: what policies and executors are told about it.

    `operation_key` is set when the call executes: the key its operation is claimed under, the same
    for every retry of this call and different for every other call, whatever id the provider gave.
    A tool declared `idempotent` uses it as the idempotency key of its side effect.
    """

    tool_name: str
    input: Any
    tool_call_id: str
    operation_key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallOrigin:
    """Where a call was made, which makes it one operation: providers may reuse their call ids.

    A call the model made is the `index`-th call of `step` of its run; a call resumed after the user
    approved it is named by its `approval_id` (server-issued and stored with the message), so an
    approval continuation that is retried finds the same operation.
    """

    step: int | None = None
    index: int = 0
    approval_id: str | None = None


_MAX_KEY_PART: Final = 80


def operation_key(scope: str, tool_call_id: str, origin: CallOrigin | None = None) -> str:
    """The operation key of a call: `scope` (its run) with its step and position, or its approval.

    At most 200 characters: a long provider id or approval id is replaced by its SHA-256.
    """
    if origin is not None and origin.approval_id is not None:
        return f"approval/{_bounded(origin.approval_id)}"
    where = "call" if origin is None or origin.step is None else f"{origin.step}.{origin.index}"
    return f"{_bounded(scope)}/{where}/{_bounded(tool_call_id)}"


def _bounded(part: str) -> str:
    if len(part) <= _MAX_KEY_PART:
        return part
    return "sha256:" + hashlib.sha256(part.encode("utf-8", "surrogatepass")).hexdigest()[:40]


ToolExecutor: TypeAlias = Callable[[ToolCall], Awaitable[Any] | AsyncIterable[Any] | Any]
"""Runs a validated call. May return a value, an awaitable, or an async iterable (its last item counts)."""

ApprovalPredicate: TypeAlias = Callable[[ToolCall], Awaitable[bool] | bool]


@dataclass(frozen=True, slots=True)
class ToolDenial:
    """A result standing for a refused execution: shown as is, never passed to an output converter."""

    output: Any


class ToolInputError(ValueError):
    """The model's arguments do not match the tool's schema; the message goes back to the model."""

    code = "invalid_tool_input"


class DuplicateToolNameError(ValueError):
    """Two tool sources offer the same name without an explicit override."""

    code = "duplicate_tool_name"

    def __init__(self, name: str) -> None:
        super().__init__(f"Duplicate tool name: {name!r}")
        self.tool_name = name


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool offered to the model.

    `execute` is None for tools that the provider runs (`native`) or that the client answers. `dynamic`
    marks tools whose set is only known at run time (MCP); the UI stream names them `dynamic-tool`.
    `to_model_output` converts a result for the model; `model_projection`, `error_format` and
    `recheck_before_model` are set by permission policies (`with_tool_policy`): the last runs once the
    executor has returned, and a denial it gives replaces what the model is told about the result.
    `idempotent` declares that running the call again under the same `ToolCall.operation_key` has no
    further effect, so an operation whose outcome is uncertain (its process died, or it raised) runs
    again instead of being refused. `approval_after_tool_results` makes a call wait for the user's
    approval whenever the model has a tool's result in its context (a tool's or an MCP server's output
    may carry instructions someone else wrote): for writes that outlive the turn, such as memories.
    `sign_in` is asked before each call: a mapping it returns pauses the call as an approval does, with
    the mapping as the call's `toolMetadata.authorization` (a card the page shows: sign in to a
    connection, `bastion.mcp.oauth`), and the answer continues it; None runs the call now.
    """

    name: str
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    execute: ToolExecutor | None = None
    needs_approval: bool | ApprovalPredicate = False
    to_model_output: Callable[[Any], Any] | None = None
    validate_input: Callable[[Any], Any] | None = None
    native: AbstractNativeTool | None = None
    dynamic: bool = False
    strict: bool | None = None
    model_projection: Callable[[Any, ToolCall], Any] | None = None
    error_format: Callable[[str, ToolCall], str] | None = None
    idempotent: bool = False
    recheck_before_model: Callable[[ToolCall], Awaitable[ToolDenial | None]] | None = None
    approval_after_tool_results: bool = False
    sign_in: Callable[[ToolCall], Awaitable[Mapping[str, Any] | None]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOOL_NAME.fullmatch(self.name):
            raise ValueError(
                f"Tool name {self.name!r} must be 1–128 letters, digits, underscores or hyphens."
            )
        if self.native is not None and (self.execute is not None or self.needs_approval is not False):
            raise ValueError(
                f"Provider-executed tool {self.name!r} cannot have a local executor or approval."
            )
        if self.validate_input is None and self.native is None:
            object.__setattr__(self, "validate_input", _schema_validator(self.input_schema))

    @property
    def provider_executed(self) -> bool:
        return self.native is not None

    def check_input(self, raw: Any) -> Any:
        """Return the validated input, or raise `ToolInputError` with a message for the model."""
        if self.validate_input is None:
            return raw
        return self.validate_input(raw)

    def model_view(self, output: Any, call: ToolCall) -> Any:
        """What the model is told about a result: projected by policy, then converted by the tool."""
        if self.model_projection is not None:
            output = self.model_projection(output, call)
        if isinstance(output, ToolDenial):
            return output.output
        return output if self.to_model_output is None else self.to_model_output(output)

    def error_view(self, error_text: str, call: ToolCall) -> str:
        """The error text the model and the UI are shown."""
        return error_text if self.error_format is None else self.error_format(error_text, call)


def _schema_validator(input_schema: Mapping[str, Any]) -> Callable[[Any], Any]:
    schema = dict(input_schema)
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator_class.check_schema(schema)
    validator = validator_class(schema)

    def validate(raw: Any) -> Any:
        errors = sorted(validator.iter_errors(raw), key=lambda error: [str(p) for p in error.absolute_path])
        if errors:
            raise ToolInputError("; ".join(_describe_schema_error(error) for error in errors[:5]))
        return raw

    return validate


def _describe_schema_error(error: jsonschema.ValidationError) -> str:
    path = "/".join(str(segment) for segment in error.absolute_path)
    return f"{path or 'input'}: {error.message}"


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool | ApprovalPredicate = False,
    to_model_output: Callable[[Any], Any] | None = None,
    idempotent: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool | ApprovalPredicate = False,
    to_model_output: Callable[[Any], Any] | None = None,
    idempotent: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` from a typed function; its parameters become the input schema.

    A parameter annotated `ToolCall` receives the call (for its id and operation key) and is not
    shown to the model. `idempotent=True` declares the side effect keyed by `call.operation_key`.
    The docstring's first paragraph is the description unless one is given.
    """

    def build(fn: Callable[..., Any], defined_in: FrameType | None = None) -> Tool:
        adapter, call_parameter, schema = _signature_of(fn, defined_in or sys._getframe(1))

        def validate(raw: Any) -> Any:
            try:
                return adapter.validate_python(raw if raw is not None else {})
            except pydantic.ValidationError as error:
                raise ToolInputError(_describe_pydantic_error(error)) from None

        async def execute(call: ToolCall) -> Any:
            validated = validate(call.input)
            arguments = {key: getattr(validated, key) for key in type(validated).model_fields}
            if call_parameter is not None:
                arguments[call_parameter] = call
            result = fn(**arguments)
            return await result if inspect.isawaitable(result) else result

        return Tool(
            name=name or fn.__name__,
            description=description if description is not None else _first_paragraph(fn.__doc__),
            input_schema=copy.deepcopy(schema),
            execute=execute,
            needs_approval=needs_approval,
            to_model_output=to_model_output,
            validate_input=_keep_raw_if_valid(validate),
            idempotent=idempotent,
        )

    return build(function, sys._getframe(1)) if function is not None else build


def _keep_raw_if_valid(validate: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Validate with pydantic but keep the JSON input: the call's input is what the UI and history store."""

    def check(raw: Any) -> Any:
        validate(raw)
        return raw

    return check


_Signature: TypeAlias = tuple[pydantic.TypeAdapter[Any], str | None, dict[str, Any]]
_signatures: OrderedDict[tuple[object, ...], _Signature] = OrderedDict()
_SIGNATURE_CACHE_SIZE = 4096
_PLAIN_DEFAULTS = (type(None), bool, int, float, str, bytes)


def _signature_of(fn: Callable[..., Any], defined_in: FrameType) -> _Signature:
    """The input validator, `ToolCall` parameter and schema of a tool function.

    Tool factories run every turn and define their tools again as closures; building a pydantic model
    each time costs milliseconds, so the result is kept per code object, resolved annotations and
    defaults, compared with their types (so `True` and `1` are different defaults). Closures of one
    factory whose annotations or defaults differ (a `Literal` of the caller's own choices) each get
    their own. `defined_in` is the frame that applied `@tool`: its local names resolve annotations
    postponed by `from __future__ import annotations`, such as a model class defined in the same
    function.
    """
    hints = _type_hints(fn, defined_in)
    key = _signature_key(fn, hints)
    if key is not None and key in _signatures:
        _signatures.move_to_end(key)
        return _signatures[key]
    model, call_parameter = _input_model(fn, hints)
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(model)
    schema = adapter.json_schema()
    schema.pop("title", None)
    signature = (adapter, call_parameter, schema)
    if key is not None:
        _signatures[key] = signature
        if len(_signatures) > _SIGNATURE_CACHE_SIZE:
            _signatures.popitem(last=False)
    return signature


def _signature_key(fn: Callable[..., Any], hints: dict[str, Any]) -> tuple[object, ...] | None:
    """What decides a tool function's schema, as a cache key; None when it cannot be compared safely."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    try:
        defaults = tuple(_typed(value) for value in fn.__defaults__ or ())
        kwdefaults = tuple(sorted((name, _typed(value)) for name, value in (fn.__kwdefaults__ or {}).items()))
        key = (code, defaults, kwdefaults, tuple(sorted(hints.items())))
        hash(key)
    except (TypeError, _Uncomparable):
        return None
    return key


class _Uncomparable(Exception):
    """A default that is not a plain value: the schema is built afresh rather than risk sharing it."""


def _typed(value: object) -> object:
    if isinstance(value, tuple):
        return (tuple, tuple(_typed(item) for item in value))
    if isinstance(value, frozenset):
        return (frozenset, frozenset(_typed(item) for item in value))
    if type(value) in _PLAIN_DEFAULTS:
        return (type(value), value)
    raise _Uncomparable


def _type_hints(fn: Callable[..., Any], defined_in: FrameType) -> dict[str, Any]:
    """Annotations resolved as Python would: names local to where the tool was defined come first."""
    try:
        return get_type_hints(fn, localns=dict(defined_in.f_locals))
    except NameError as error:
        raise TypeError(
            f"Tool function {fn.__name__!r} has an annotation that cannot be resolved: {error}"
        ) from None


def _input_model(
    fn: Callable[..., Any], hints: dict[str, Any]
) -> tuple[type[pydantic.BaseModel], str | None]:
    fields: dict[str, Any] = {}
    call_parameter: str | None = None
    for parameter in inspect.signature(fn).parameters.values():
        annotation = hints.get(parameter.name, Any)
        if annotation is ToolCall:
            call_parameter = parameter.name
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"Tool function {fn.__name__!r} cannot take *args or **kwargs.")
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (annotation, default)
    model = pydantic.create_model(
        f"{fn.__name__}_input", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    return model, call_parameter


def _describe_pydantic_error(error: pydantic.ValidationError) -> str:
    details = []
    for item in error.errors(include_url=False, include_input=False)[:5]:
        location = "/".join(str(segment) for segment in item["loc"])
        details.append(f"{location or 'input'}: {item['msg']}")
    return "; ".join(details)


def _first_paragraph(doc: str | None) -> str:
    return inspect.cleandoc(doc).split("\n\n", 1)[0].replace("\n", " ") if doc else ""


def compose_tools(
    base: Iterable[Tool],
    *extensions: Iterable[Tool],
    overrides: Iterable[Tool] = (),
) -> list[Tool]:
    """Combine tool sources. A name offered twice is an error; replacing one needs `overrides`.

    An override must name a tool that exists, so a typo cannot silently add a tool instead.
    """
    composed: dict[str, Tool] = {}
    for source in (base, *extensions):
        for item in source:
            if item.name in composed:
                raise DuplicateToolNameError(item.name)
            composed[item.name] = item
    seen_overrides: set[str] = set()
    for item in overrides:
        if item.name in seen_overrides:
            raise DuplicateToolNameError(item.name)
        if item.name not in composed:
            raise ValueError(f"Override for unknown tool {item.name!r}.")
        seen_overrides.add(item.name)
        composed[item.name] = item
    return list(composed.values())


def index_tools(tools: Sequence[Tool]) -> dict[str, Tool]:
    """Index tools by name, refusing duplicates."""
    indexed: dict[str, Tool] = {}
    for item in tools:
        if item.name in indexed:
            raise DuplicateToolNameError(item.name)
        indexed[item.name] = item
    return indexed


async def run_executor(executor: ToolExecutor, call: ToolCall) -> Any:
    """Run an executor and reduce whatever it returns to one final value."""
    result = executor(call)
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, AsyncIterable):
        final: Any = None
        async for item in result:
            final = item
        return final
    return result

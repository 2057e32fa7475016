"""A tool call's result as the model sees it: structured content, or the content items as JSON."""

from __future__ import annotations

from typing import Any

from mcp import types as mcp_types


def tool_output(result: mcp_types.CallToolResult) -> Any:
    """`structuredContent`, else `{"content": [...]}`; an `isError` result keeps both and says so."""
    content = [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in result.content]
    if not result.is_error:
        if result.structured_content is not None:
            return result.structured_content
        return {"content": content}
    output: dict[str, Any] = {"content": content, "isError": True}
    if result.structured_content is not None:
        output["structuredContent"] = result.structured_content
    return output

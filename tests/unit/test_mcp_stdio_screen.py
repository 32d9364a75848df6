"""The MCP stdio screen: every line the SDK cannot turn into a request is answered, responses never are."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import types
from pydantic import ValidationError

from scopekb_query.mcp_server import _idless_answer, _unparsed_answer


def _screened(line: str) -> dict[str, Any] | None:
    """What the screen answers to ``line`` as the SDK's stdin reader hands it over (an exception or a message)."""
    from mcp.shared.message import SessionMessage

    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as exc:
        answer = _unparsed_answer(exc)
    else:
        answer = _idless_answer(SessionMessage(message))
    return None if answer is None else answer.message.model_dump(by_alias=True, exclude_unset=True)


@pytest.mark.parametrize(("line", "rid", "code"), [
    ("not json", None, -32700),
    ('{"id": 5, "method": "ping"}', 5, -32600),
    ('{"jsonrpc": "1.0", "id": "a", "method": "ping"}', "a", -32600),
    ('[{"jsonrpc": "2.0", "id": 6, "method": "ping"}]', None, -32600),
    ("42", None, -32600),
    ('"text"', None, -32600),
    ('{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}', None, -32600),
    ('{"jsonrpc": "2.0", "id": true, "method": "tools/call"}', None, -32600),
    ('{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": 5}', 8, -32600),
    ('{"jsonrpc": "2.0", "id": 9, "method": 5}', 9, -32600),
    ('{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"arguments": {"q": "\\ud800"}}}', 3, -32602),
])
def test_a_line_that_is_no_valid_request_is_answered(line: str, rid: Any, code: int) -> None:
    got = _screened(line)
    assert got is not None and got["id"] == rid and got["error"]["code"] == code, got


@pytest.mark.parametrize("line", [
    '{"jsonrpc": "2.0", "id": 3, "result": 5}',  # a malformed response: never answered
    '{"jsonrpc": "2.0", "id": 3, "error": {}}',
    '{"jsonrpc": "2.0", "method": "notifications/initialized"}',  # a real notification: the SDK's
    '{"jsonrpc": "2.0", "id": 4, "method": "tools/list"}',  # a valid request: the SDK's
])
def test_responses_notifications_and_valid_requests_are_left_to_the_sdk(line: str) -> None:
    assert _screened(line) is None


def test_the_answer_names_the_path_bounded_and_nothing_else_of_the_line() -> None:
    key = "k" * 5000
    line = '{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"KEY": "\\udfff", "x": "secret"}}'
    got = _screened(line.replace("KEY", key))
    assert got is not None and got["error"]["code"] == -32602
    assert len(got["error"]["message"]) < 400 and "secret" not in got["error"]["message"]

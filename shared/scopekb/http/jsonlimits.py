"""JSON nesting limits for every place request input is parsed (issue 16).

Python's ``json`` recurses once per nesting level: ``[`` × 1000 raised ``RecursionError`` (a 500) on the webhook
routes. :class:`DepthScanner` measures the nesting of a body as it streams in (no buffering, no parse), and
:func:`loads_bounded` parses only bodies within the limit.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Default nesting limit (``http.json_max_depth``): webhook payloads nest about 6 levels, MCP/JSON-RPC about 8.
DEFAULT_MAX_DEPTH = 64

_STRUCTURAL = re.compile(rb'[\[\]{}"\\]')


class JsonTooDeep(ValueError):
    """A JSON text nests deeper than allowed (HTTP 400); the message names the limit."""


class DepthScanner:
    """Track the bracket nesting of a JSON text fed in pieces, outside strings (escapes honoured).

    Linear in the input; only the structural bytes (brackets, quotes, backslashes) are looked at in Python. The
    scanner does not validate JSON: a malformed text is left for the parser to refuse.

    Args:
        max_depth: deepest nesting allowed (``[[1]]`` has depth 2).
    """

    def __init__(self, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.max_depth = max_depth
        self.depth = 0
        self._in_string = False
        self._skip_first = False  # a backslash ended the previous piece: its escaped byte starts this one

    def feed(self, data: bytes) -> None:
        """Scan the next piece of the text.

        Raises:
            JsonTooDeep: the nesting exceeded ``max_depth``.
        """
        if not data:
            return
        skip_at = 0 if self._skip_first else -1
        self._skip_first = False
        if not self._in_string and data.count(b"[") + data.count(b"{") + self.depth <= self.max_depth:
            # Cheap exit: even if every bracket of this piece opened a level, the limit holds. Track strings and
            # depth anyway only when needed later, so fall through only when the piece has quotes or closers.
            if b'"' not in data and b"\\" not in data:
                self.depth = max(0, self.depth + data.count(b"[") + data.count(b"{")
                                 - data.count(b"]") - data.count(b"}"))
                return
        for m in _STRUCTURAL.finditer(data):
            pos = m.start()
            if pos == skip_at:
                continue
            c = data[pos]
            if self._in_string:
                if c == 0x5C:  # backslash: the next byte is escaped
                    if pos + 1 == len(data):
                        self._skip_first = True
                    else:
                        skip_at = pos + 1
                elif c == 0x22:
                    self._in_string = False
                continue
            if c == 0x22:
                self._in_string = True
            elif c in (0x5B, 0x7B):
                self.depth += 1
                if self.depth > self.max_depth:
                    raise JsonTooDeep(f"JSON nested deeper than {self.max_depth} levels (http.json_max_depth)")
            elif c in (0x5D, 0x7D):
                self.depth = max(0, self.depth - 1)


def check_depth(data: bytes | str, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Refuse a whole JSON text nested deeper than ``max_depth``.

    Raises:
        JsonTooDeep: with the limit in the message.
    """
    if data.count("[" if isinstance(data, str) else b"[") + data.count("{" if isinstance(data, str) else b"{") \
            <= max_depth:
        return  # no more opening brackets than levels allowed (strings included): cannot nest deeper (issue 20)
    DepthScanner(max_depth).feed(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)


def loads_bounded(data: bytes | str, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """``json.loads`` for untrusted input: the nesting is checked first, so the parser never recurses deeper than
    ``max_depth`` (no ``RecursionError``).

    Raises:
        JsonTooDeep: nested deeper than ``max_depth`` (a ``ValueError``).
        ValueError: not JSON (``json.JSONDecodeError``) or not decodable text.
    """
    check_depth(data, max_depth)
    try:
        return json.loads(data)
    except RecursionError:  # cannot happen below the interpreter's limit; kept so no input gives a 500
        raise JsonTooDeep(f"JSON nested deeper than {max_depth} levels (http.json_max_depth)") from None

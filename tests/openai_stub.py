"""An OpenAI-compatible embeddings server for tests, on a real socket (127.0.0.1, random port).

``POST /v1/embeddings`` answers like the OpenAI API (request and response shapes of the API reference:
``input`` a string or a list of strings, ``model``, optional ``dimensions`` and ``encoding_format``
``float``/``base64``; response ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
"model", "usage": {"prompt_tokens", "total_tokens"}}``; errors ``{"error": {"message", "type", "param",
"code"}}``), with vectors from whatever ``encode`` function it is given: the tests give it the local
all-MiniLM-L6-v2 model, so the ``openai`` provider can be checked against the ``local`` one.

It enforces the API's limits (2,048 inputs, 300,000 tokens a request, no empty strings) and has fault
injection knobs, all thread-safe:

- :meth:`OpenAIStub.fail_with_429` ``(times, retry_after)``: the next ``times`` requests get 429 with that
  ``Retry-After`` header;
- :meth:`OpenAIStub.fail_with_5xx` ``(times, status=500)``;
- :attr:`OpenAIStub.bad_inputs`: any request containing one of these texts gets 400 (``param: "input"``), like
  the real API refusing a whole request for one bad input;
- :attr:`OpenAIStub.shuffle`: return ``data`` in reverse order (indices stay right).

Every request is logged in :attr:`OpenAIStub.requests` (inputs, status, monotonic time).

Run it by hand with the local model: ``python tests/openai_stub.py --port 8089``.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

Encode = Callable[[list[str]], np.ndarray]
CountTokens = Callable[[list[str]], list[int]]


@dataclass
class StubRequest:
    """One request the stub received: its inputs (None if the body was not understood) and the status sent."""

    inputs: list[str] | None
    status: int
    at: float
    body: dict[str, Any] = field(default_factory=dict)


class OpenAIStub:
    """The server. Use as a context manager or call :meth:`start` / :meth:`stop`.

    Args:
        encode: texts -> float32 array ``(n, d)``.
        count_tokens: texts -> tokens each (for ``usage`` and the per-request token limit); default: words + 2.
        api_key: when set, requests must carry ``Authorization: Bearer <api_key>`` (else 401).
        max_inputs: inputs per request (OpenAI: 2,048).
        max_request_tokens: tokens summed per request (OpenAI: 300,000).
        max_input_tokens: per-input token limit; None: no limit (the local model truncates at 256).
    """

    def __init__(self, encode: Encode, count_tokens: CountTokens | None = None, *, api_key: str | None = None,
                 max_inputs: int = 2048, max_request_tokens: int = 300_000,
                 max_input_tokens: int | None = None) -> None:
        self._encode = encode
        self._count = count_tokens or (lambda texts: [len(t.split()) + 2 for t in texts])
        self.api_key = api_key
        self.max_inputs = max_inputs
        self.max_request_tokens = max_request_tokens
        self.max_input_tokens = max_input_tokens
        self.bad_inputs: set[str] = set()
        self.shuffle = False
        self.requests: list[StubRequest] = []
        self._lock = threading.Lock()
        self._encode_lock = threading.Lock()
        self._faults: list[tuple[int, dict[str, str]]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._native_dim: int | None = None

    # --- knobs ------------------------------------------------------------------------------------------------

    def fail_with_429(self, times: int, retry_after: str | None = "1") -> None:
        """The next ``times`` requests get 429, with ``Retry-After: retry_after`` unless it is None."""
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        with self._lock:
            self._faults.extend([(429, headers)] * times)

    def fail_with_5xx(self, times: int, status: int = 500) -> None:
        """The next ``times`` requests get ``status`` (500 by default) without Retry-After."""
        with self._lock:
            self._faults.extend([(status, {})] * times)

    def reset(self) -> None:
        """Clear faults, bad inputs, shuffling and the request log."""
        with self._lock:
            self._faults.clear()
            self.bad_inputs.clear()
            self.shuffle = False
            self.requests.clear()

    def served(self) -> list[StubRequest]:
        """Requests answered with 200, in arrival order."""
        with self._lock:
            return [r for r in self.requests if r.status == 200]

    # --- lifecycle --------------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``, the ``base_url`` for the ``openai`` SDK."""
        if self._server is None:
            raise RuntimeError("stub not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self, port: int = 0) -> OpenAIStub:
        """Listen on 127.0.0.1 (``port`` 0: a free one) in a daemon thread."""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms delayed ACKs

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                pass

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, headers, body = stub._handle(self.path, dict(self.headers.items()), raw)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                data = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}).encode()
                self.send_response(200 if self.path.rstrip("/").endswith("/models") else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="openai-stub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and join the server thread."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OpenAIStub:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- request handling -------------------------------------------------------------------------------------

    @staticmethod
    def _error(status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
               code: str | None = None) -> dict[str, Any]:
        return {"error": {"message": message, "type": type_, "param": param, "code": code}}

    def _log(self, inputs: list[str] | None, status: int, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(StubRequest(inputs=inputs, status=status, at=time.monotonic(), body=body))

    def _handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, str], dict]:
        if path.rstrip("/") not in ("/v1/embeddings", "/embeddings"):
            return 404, {}, self._error(404, f"unknown path {path}", type_="not_found")
        lowered = {k.lower(): v for k, v in headers.items()}
        if self.api_key is not None and lowered.get("authorization") != f"Bearer {self.api_key}":
            self._log(None, 401, {})
            return 401, {}, self._error(401, "Incorrect API key provided.", code="invalid_api_key")
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body is not an object")
        except ValueError as e:
            self._log(None, 400, {})
            return 400, {}, self._error(400, f"We could not parse the JSON body of your request: {e}")
        inp = body.get("input")
        inputs: list[str] | None
        if isinstance(inp, str):
            inputs = [inp]
        elif isinstance(inp, list) and all(isinstance(x, str) for x in inp):
            inputs = list(inp)
        else:
            inputs = None
        meta = {k: v for k, v in body.items() if k != "input"}
        with self._lock:
            fault = self._faults.pop(0) if self._faults else None
        if fault is not None:
            status, fault_headers = fault
            self._log(inputs, status, meta)
            if status == 429:
                return 429, fault_headers, self._error(429, "Rate limit reached (stub).", type_="requests",
                                                       code="rate_limit_exceeded")
            return status, fault_headers, self._error(status, "The server had an error (stub).", type_="server_error")

        def refuse(message: str, param: str | None = "input") -> tuple[int, dict[str, str], dict]:
            self._log(inputs, 400, meta)
            return 400, {}, self._error(400, message, param=param)

        if inputs is None:
            return refuse("'input' must be a string or an array of strings (token arrays are not supported here)")
        if not body.get("model"):
            return refuse("you must provide a model parameter", param="model")
        if not inputs:
            return refuse("'$.input' is invalid: an empty array")
        if len(inputs) > self.max_inputs:
            return refuse(f"'$.input' is invalid: array of {len(inputs)} items exceeds {self.max_inputs}")
        if any(t == "" for t in inputs):
            return refuse("'$.input' is invalid. Please check the API reference: an input is an empty string")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            return refuse(f"invalid encoding_format {fmt!r}", param="encoding_format")
        bad = [t for t in inputs if t in self.bad_inputs]
        if bad:
            return refuse(f"Invalid input: {bad[0][:40]!r} cannot be embedded (stub fault).")
        counts = self._count(inputs)
        if sum(counts) > self.max_request_tokens:
            return refuse(f"Requested {sum(counts)} tokens, max {self.max_request_tokens} tokens per request")
        if self.max_input_tokens is not None:
            for t, c in zip(inputs, counts, strict=True):
                if c > self.max_input_tokens:
                    return refuse(f"This model's maximum context length is {self.max_input_tokens} tokens, "
                                  f"however you requested {c} tokens ({t[:20]!r}...)")
        with self._encode_lock:
            vectors = np.asarray(self._encode(inputs), dtype=np.float32)
        dims = body.get("dimensions")
        if dims is not None and dims != vectors.shape[1]:
            return refuse("This model does not support specifying dimensions.", param="dimensions")
        data = []
        for i, row in enumerate(vectors):
            emb: Any = (base64.b64encode(row.astype("<f4").tobytes()).decode() if fmt == "base64"
                        else row.tolist())
            data.append({"object": "embedding", "index": i, "embedding": emb})
        if self.shuffle:
            data.reverse()
        self._log(inputs, 200, meta)
        tokens = int(sum(counts))
        return 200, {}, {"object": "list", "data": data, "model": body["model"],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def local_model_stub(**kwargs: Any) -> OpenAIStub:
    """A stub serving the local all-MiniLM-L6-v2 vectors (loads the model; needs the ``local`` extra)."""
    from scopekb.embedding.local import LocalEmbedder

    local = LocalEmbedder()
    return OpenAIStub(local.encode, local.count_tokens, **kwargs)


def main(argv: Sequence[str] | None = None) -> None:
    """``python tests/openai_stub.py [--port N] [--api-key K]``: serve the local model until interrupted."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args(argv)
    stub = local_model_stub(api_key=args.api_key).start(args.port)
    print(stub.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stub.stop()


if __name__ == "__main__":
    main()

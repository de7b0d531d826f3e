"""The HTTP side: a standard-library ``ThreadingHTTPServer`` (one thread per connection) over one ``Engine``.

Routes: ``GET /health``, ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/completions``,
``POST /v1/chat/completions``. A whole response carries a Content-Length and keeps the connection; a stream
is Server-Sent Events (``data: {json}`` blocks, then ``data: [DONE]``) and closes it. Every error is
OpenAI's error body. A client that goes away mid-stream fails the next write; its request is cancelled.
"""
from __future__ import annotations

import json
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

from fuelpipe.api import TextModel
from fuelpipe.serve.app import ServeApp
from fuelpipe.serve.engine import Engine, EngineSpec
from fuelpipe.serve.openai_request import ApiError, generation_spec, parse_body
from fuelpipe.serve.text_run import GenerationFailed

MAX_BODY_BYTES = 16 * 2**20
POST_ROUTES = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}
GET_ROUTES = ("/health", "/v1/models")
GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)  # the client went away


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fuelpipe-serve"
    server: "_HttpServer"

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def log_message(self, format: str, *args) -> None:
        if self.server.log_requests:
            super().log_message(format, *args)

    # ---- routes --------------------------------------------------------------------------
    def _get(self, path: str) -> None:
        app = self.server.app
        if path == "/health":
            self._json(200, app.health())
        elif path == "/v1/models":
            self._json(200, app.models())
        elif path.startswith("/v1/models/"):
            self._json(200, app.model(path[len("/v1/models/"):]))
        elif path in POST_ROUTES:
            raise ApiError(405, f"{path} takes POST, got GET")
        else:
            raise ApiError(404, f"unknown path {path!r}; fuelpipe serve answers GET {list(GET_ROUTES)} and "
                                f"POST {list(POST_ROUTES)}", code="unknown_url")

    def _post(self, path: str) -> None:
        if path not in POST_ROUTES:
            self.close_connection = True  # the body is left unread
            if path in GET_ROUTES:
                raise ApiError(405, f"{path} takes GET, got POST")
            raise ApiError(404, f"unknown path {path!r}; fuelpipe serve answers POST {list(POST_ROUTES)}",
                           code="unknown_url")
        spec = generation_spec(POST_ROUTES[path], parse_body(self._body()))
        responder, run = self.server.app.start(spec)
        if not spec.stream:
            try:
                text = "".join(run.pieces())
            except GenerationFailed as err:
                raise ApiError(500, str(err), type="server_error") from None
            self._json(200, responder.whole(text, run.finish_reason, run.usage))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        pieces = run.pieces()
        try:
            if spec.kind == "chat":
                self._event(responder.chunk("", first=True))
            for piece in pieces:
                self._event(responder.chunk(piece))
            self._event(responder.chunk("", run.finish_reason))
            if spec.include_usage:
                self._event(responder.usage_chunk(run.usage))
            self._event("[DONE]")
        except GenerationFailed as err:
            self._event(ApiError(500, str(err), type="server_error").body())
        finally:
            pieces.close()  # a client gone mid-stream: its request is cancelled here

    # ---- plumbing ------------------------------------------------------------------------
    def _answer(self, route: Callable[[str], None]) -> None:
        try:
            route(self.path.split("?", 1)[0])
        except ApiError as err:
            self._json(err.status, err.body())
        except GONE:
            self.close_connection = True
        except Exception as err:  # a bug: answer 500 (the traceback goes to stderr), keep serving
            traceback.print_exc(file=sys.stderr)
            self.close_connection = True
            try:
                self._json(500, ApiError(500, f"internal error: {type(err).__name__}: {err}",
                                         type="server_error").body())
            except (OSError, ValueError):
                pass  # the response had begun, or the client is gone

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True
            raise ApiError(411, f"a request body needs a Content-Length header, got {length!r}")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise ApiError(413, f"the request body holds {int(length)} bytes, more than {MAX_BODY_BYTES}")
        return self.rfile.read(int(length))

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _event(self, body: dict | str) -> None:
        data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True  # a connection still open at shutdown does not hold the process
    app: ServeApp
    log_requests: bool


class Server:
    """The engine and the HTTP server over it: ``serve_forever`` on this thread, or ``start`` a thread for it."""

    def __init__(self, model: TextModel, model_id: str, spec: Optional[EngineSpec] = None, *,
                 host: str = "127.0.0.1", port: int = 8000, log_requests: bool = False) -> None:
        self.engine = Engine(model.context, spec)
        try:
            self.httpd = _HttpServer((host, port), Handler)
        except OSError:
            self.engine.stop()
            raise
        self.httpd.app = ServeApp(model, self.engine, model_id)
        self.httpd.log_requests = log_requests
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> "Server":
        self._thread = threading.Thread(target=self.serve_forever, name="fuelpipe-http", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop taking connections, end every unfinished request, stop the engine."""
        if self._thread is not None:
            self.httpd.shutdown()  # returns once the serving thread's loop has stopped
            self._thread.join()
        self.httpd.server_close()
        self.engine.stop()

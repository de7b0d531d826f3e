"""``fuelpipe serve --model NAME|FILE.gguf|HF_DIR``: an OpenAI-compatible HTTP server on the continuous batcher.

Exit codes, as the rest of the CLI: 0 stopped by SIGTERM; 2 a setting or checkpoint that cannot serve (the
model does not load, the port is taken, a bad number), found before anything is served; 130 Ctrl-C (SIGINT).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

CONFIG_EXIT, INTERRUPTED_EXIT, TERMINATED_EXIT = 2, 130, 0


class _Terminated(Exception):
    """SIGTERM, raised on the main thread so the server stops as it does for Ctrl-C."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fuelpipe serve", description=(
        "An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /v1/models, /health) on "
        "fuelpipe's continuous batcher. See docs/serving.md."))
    p.add_argument("--model", required=True,
                   help="a named checkpoint (smollm2_135m, gemma3_270m), a .gguf file or an HF directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port (default %(default)s; 0 picks a free one)")
    p.add_argument("--max-batch", type=int, default=4, help="requests decoded at once (default %(default)s)")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="positions per request, prompt and completion together (default 2048, or the model's "
                        "limit when lower)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    p.add_argument("--backend", default="aot", help="the held plan's backend (default %(default)s)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the name, or the file or directory name)")
    p.add_argument("--quiet", action="store_true", help="do not log each request to stderr")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        server = _build(args)
    except KeyboardInterrupt:
        print("fuelpipe serve: interrupted (Ctrl-C) while loading; nothing was served", file=sys.stderr)
        return INTERRUPTED_EXIT
    if isinstance(server, str):
        print(f"fuelpipe serve: configuration error: {server}", file=sys.stderr)
        return CONFIG_EXIT
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    print(f"fuelpipe serve: {server.httpd.app.model_id} at {server.url}/v1 (max batch {args.max_batch}, "
          f"{server.engine.width} positions per request); Ctrl-C stops", flush=True)
    code = 0
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, _exit_at_once)  # a second Ctrl-C while closing: leave now, no traceback
        code = INTERRUPTED_EXIT
    except _Terminated:
        code = TERMINATED_EXIT
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
    how = "interrupted (Ctrl-C)" if code == INTERRUPTED_EXIT else "terminated (SIGTERM)"
    print(f"fuelpipe serve: {how}; stopped after {server.engine.counts['requests']} requests", file=sys.stderr)
    return code


def _build(args: argparse.Namespace):
    """The server, or the reason it cannot be built (a string)."""
    import fuelpipe
    from fuelpipe.errors import FuelpipeError
    from fuelpipe.serve.engine import EngineSpec
    from fuelpipe.serve.server import Server
    from fuelpipe.weights.named import NAMED

    if not 0 <= args.port <= 65535:
        return f"--port must lie in [0, 65535] (0 = any free port), got {args.port}"
    try:
        spec = EngineSpec(args.max_batch, args.max_seq_len)
        model = fuelpipe.load(args.model, dtype=args.dtype, backend=args.backend, threads=args.threads)
        name = args.served_model_name or (args.model if args.model in NAMED else Path(args.model).name)
        return Server(model, name, spec, host=args.host, port=args.port, log_requests=not args.quiet)
    except FuelpipeError as err:
        return str(err)
    except OSError as err:  # the address is taken or cannot be bound
        return f"cannot listen on {args.host}:{args.port}: {err.strerror or err}"


def _exit_at_once(signum, frame) -> None:
    os._exit(INTERRUPTED_EXIT)


def _on_sigterm(signum, frame) -> None:
    raise _Terminated()

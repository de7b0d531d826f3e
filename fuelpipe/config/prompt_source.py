"""Prompts a shell cannot mangle: ``prompt=@FILE`` (the file's text) and ``prompt=-`` (stdin's).

The command line is rewritten before anything runs: each such override becomes ``key="<the text>"``,
quoted so that Hydra composes exactly the text (``override_literal``), so a sweep's jobs, the run's
recorded overrides and its results all hold the prompt itself. One final newline is dropped (an editor's,
or echo's). ``experiment.generate.prompts=[@a.txt,@b.txt]`` reads each ``@`` element the same way.
A quoted value (``'prompt="@home"'``) is text, never a path.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from fuelpipe.config.override_text import PROMPT_KEYS, override_literal, split_key
from fuelpipe.errors import ConfigError

PROMPT_LIST_KEY = "experiment.generate.prompts"
STDIN = "-"


def read_prompt_sources(overrides: list[str], stdin: TextIO | None = sys.stdin) -> dict[str, str]:
    """``{override as typed: the override holding the text}`` for each ``@FILE`` / ``-`` prompt; raises
    ``ConfigError`` naming the override and the file (or stdin) that gave no text."""
    rewritten = {}
    for override in overrides:
        kv = split_key(override)
        if kv is None:
            continue
        key, value = kv
        if key.lstrip("+") in PROMPT_KEYS and (value.startswith("@") or value == STDIN):
            text = _stdin_text(override, stdin) if value == STDIN else _file_text(override, value[1:])
            rewritten[override] = f"{key}={override_literal(text)}"
        elif key.lstrip("+") == PROMPT_LIST_KEY and "@" in value:
            items = _parse_list(override)
            if isinstance(items, list) and any(isinstance(i, str) and i.startswith("@") for i in items):
                texts = [_file_text(override, i[1:]) if isinstance(i, str) and i.startswith("@") else str(i)
                         for i in items]
                rewritten[override] = f"{key}=[{','.join(override_literal(t) for t in texts)}]"
    return rewritten


def _file_text(override: str, path: str) -> str:
    file = Path(path).expanduser()
    if not path:
        raise ConfigError(f"{override!r} names no file: write prompt=@path/to/prompt.txt")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(f"{override!r}: cannot read the prompt file {str(file.resolve())!r}: {reason}") from None
    return _checked(override, _one_line_end_dropped(text), f"the prompt file {str(file.resolve())!r}")


def _stdin_text(override: str, stdin: TextIO) -> str:
    if stdin is None:
        raise ConfigError(f"{override!r} reads the prompt from stdin, but this process has none")
    if stdin.isatty():
        print("fuelpipe: reading the prompt from stdin; end it with Ctrl-D", file=sys.stderr, flush=True)
    return _checked(override, _one_line_end_dropped(stdin.read()), "stdin")


def _checked(override: str, text: str, source: str) -> str:
    if not text.strip():
        raise ConfigError(f"{override!r}: {source} holds no prompt text ({text!r}); "
                          f"e.g. echo 'Your prompt' | python -m fuelpipe ... prompt=-")
    return text


def _one_line_end_dropped(text: str) -> str:
    for end in ("\r\n", "\n"):
        if text.endswith(end):
            return text[: -len(end)]
    return text


def _parse_list(override: str) -> object:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(override).value()
    except HydraException:
        return None  # preflight reports the unparsable override with its hint

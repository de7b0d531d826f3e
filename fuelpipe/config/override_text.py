"""Free text in a Hydra override: the quoted form that composes back to the text, and the hint shown
when a value the user typed does not parse.

A value goes through two grammars: Hydra's override grammar (where ``,`` makes a sweep, ``'`` and ``"``
open quoted strings) and then OmegaConf's (where ``${`` opens an interpolation). ``override_literal``
escapes for both, so ``key=<literal>`` composes to exactly the text; ``shell_word`` adds the shell's
quoting on top, which is what a user types.
"""
from __future__ import annotations

import re
import shlex

from hydra.errors import HydraException

# A run of backslashes directly before what the grammar treats specially: OmegaConf's ``${``, Hydra's
# closing quote (or the end of the quoted string). Backslashes anywhere else are literal in both.
_BEFORE_INTERPOLATION = re.compile(r"(\\*)\$\{")
_BEFORE_QUOTE = re.compile(r'(\\*)("|\Z)')

PROMPT_KEYS = ("prompt", "experiment.generate.prompt")


def override_literal(text: str) -> str:
    """``text`` as a double-quoted Hydra override value that composes to ``text`` itself."""
    text = _BEFORE_INTERPOLATION.sub(lambda m: m.group(1) * 2 + "\\${", text)  # OmegaConf: a literal "${"
    text = _BEFORE_QUOTE.sub(lambda m: m.group(1) * 2 + ("\\" + m.group(2) if m.group(2) else ""), text)
    return f'"{text}"'


def shell_word(key: str, text: str) -> str:
    """What to type in a POSIX shell so that ``key`` gets ``text``: ``'prompt="Hello, how are you?"'``."""
    return shlex.quote(f"{key}={override_literal(text)}")


def quoting_hint(key: str, text: str) -> str:
    """How to pass ``text`` to ``key``: the quoted word; for a prompt, the file and stdin forms too."""
    lines = [f"to pass {text!r} as {key}, quote it for the shell and for Hydra:", f"    {shell_word(key, text)}"]
    if key.lstrip("+") in PROMPT_KEYS:
        lines += [f"or read it from a file: {key}=@path/to/prompt.txt, or from stdin: {key}=- "
                  f"(echo ... | python -m fuelpipe ... {key}=-)"]
    return "\n  ".join(lines)


def split_key(override: str) -> tuple[str, str] | None:
    """``(key, value)`` of ``key=value`` as typed (``+``/``++`` kept on the key), or None without a key."""
    key, sep, value = override.partition("=")
    if not sep or not re.fullmatch(r"\+{0,2}[\w.\-/@:]+", key):
        return None
    return key, value


def parse_problems(overrides: list[str], parse) -> list[str]:
    """One problem per override Hydra's grammar refuses, naming it and how to quote what was meant.

    ``parse(override)`` raises for an override that does not parse. Words without ``key=`` right after an
    override are taken for the rest of its value, split by the shell at its spaces."""
    problems, i = [], 0
    while i < len(overrides):
        words = _stray_words(overrides, i + 1)
        reason = _refusal(parse, overrides[i])
        kv = split_key(overrides[i])
        if kv and words:
            key, value = kv
            text = " ".join([value, *words])
            what = "is not an override" if len(words) == 1 else "are not overrides"
            problems.append(f"{', '.join(map(repr, words))} {what} (key=value); if {'it is' if len(words) == 1 else 'they are'} "
                            f"the rest of {overrides[i]!r}, split by the shell at its spaces, quote the whole:"
                            f"\n  {quoting_hint(key, text)}")
            i += 1 + len(words)
            continue
        if reason is not None:
            if kv:
                problems.append(f"cannot parse the override {overrides[i]!r} ({reason})\n  {quoting_hint(*kv)}")
            else:
                problems.append(f"cannot parse the override {overrides[i]!r} ({reason}); an override is key=value")
        i += 1
    return problems


def _stray_words(overrides: list[str], start: int) -> list[str]:
    end = start
    while end < len(overrides) and "=" not in overrides[end] and not overrides[end].startswith("~"):
        end += 1
    return overrides[start:end]


def _refusal(parse, override: str) -> str | None:
    """Why Hydra's grammar refuses ``override`` (without its list of the tokens it expected), or None."""
    try:
        parse(override)
        return None
    except HydraException as err:  # the grammar's reason, raised by Hydra's error listener
        return str(err).splitlines()[0].split(" expecting ")[0].strip() or type(err).__name__

"""Prompts as a user types them, through the real CLI: a value the shell or Hydra's grammar mangles exits 2
naming the override and printing the quoting that works (and that quoting, run, gives the intended prompt);
``prompt=@FILE`` and ``prompt=-`` take the text from a file or stdin."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli, with_tiny_model
from models.registry import build_random_model
from _support.weights_helpers import write_llama_gguf

QUICK = ["experiment=generate", "backend=eager", "max_new_tokens=1"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", build_random_model("llama", "tiny", seed=5))


def _generated_prompt(tmp_path: Path, gguf: Path, *args: str, stdin: str | None = None) -> str:
    run = tmp_path / "run"
    argv = ["model=llama_tiny", "model.weights=gguf", f"model.path={gguf}", *QUICK, *args, f"hydra.run.dir={run}"]
    if stdin is None:
        proc = run_cli(*argv, cwd=tmp_path)
    else:
        env = dict(os.environ, CI="true", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, "-m", "fuelpipe", *with_tiny_model(argv)], cwd=tmp_path, env=env, input=stdin,
                              capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads((run / "results.json").read_text())["generation"]["prompt"]


def _suggested_words(stderr: str) -> list[str]:
    """The quoted command-line word the error suggests (the line after "quote it for the shell and for Hydra")."""
    lines = stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if "quote it for the shell and for Hydra" in line)
    return shlex.split(lines[at + 1])  # as the shell splits what the user pastes


@pytest.mark.parametrize("typed, meant, shown", [
    # prompt=Hello, how are you?  typed unquoted: the shell makes four words
    (["prompt=Hello,", "how", "are", "you?"], "Hello, how are you?", """'prompt="Hello, how are you?"'"""),
    # "prompt=What's a cache?": one word, but Hydra's lexer stops at the apostrophe
    (["prompt=What's a cache?"], "What's a cache?", """'prompt="What'"'"'s a cache?"'"""),
    # a comma in one word: a sweep in a run that is not one
    (["prompt=Hello, world"], "Hello, world", """'prompt="Hello, world"'"""),
], ids=["split-by-the-shell", "apostrophe", "comma"])
def test_a_prompt_hydra_cannot_parse_exits_2_with_the_quoting_that_works(tmp_path, tiny_gguf, typed, meant, shown):
    proc = run_cli(*QUICK, *typed, f"hydra.run.dir={tmp_path / 'refused'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    err = proc.stderr
    assert "Traceback" not in proc.stdout + err and "internal error" not in err, err
    assert "fuelpipe: configuration error: " in err and typed[-1] in err  # names the override (or word) refused
    assert shown in err and "prompt=@path/to/prompt.txt" in err and "prompt=-" in err
    assert not (tmp_path / "refused").exists()  # nothing ran
    # The suggestion, pasted as the shell splits it, generates from exactly the prompt meant
    assert _generated_prompt(tmp_path, tiny_gguf, *_suggested_words(err)) == meant


def test_prompt_from_a_file_and_from_stdin_is_the_text_as_written(tmp_path, tiny_gguf):
    text = 'What\'s a "cache", ${really}?\n\tTwo lines, a back\\slash.'
    (tmp_path / "prompt.txt").write_text(text + "\n")  # one final newline (an editor's) is dropped
    assert _generated_prompt(tmp_path, tiny_gguf, "prompt=@prompt.txt") == text
    assert _generated_prompt(tmp_path, tiny_gguf, "prompt=-", stdin=text + "\n") == text


@pytest.mark.parametrize("args, stdin, message", [
    (["prompt=@missing.txt"], None, "cannot read the prompt file '{tmp}/missing.txt': No such file or directory"),
    (["prompt=-"], "", "'prompt=-': stdin holds no prompt text"),
    (["prompt=@empty.txt"], None, "the prompt file '{tmp}/empty.txt' holds no prompt text"),
], ids=["missing-file", "empty-stdin", "empty-file"])
def test_a_prompt_source_without_text_exits_2_naming_it(tmp_path, args, stdin, message):
    (tmp_path / "empty.txt").write_text("\n")
    env = dict(os.environ, CI="true", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "fuelpipe", "model=llama_tiny", "backend=fx", *QUICK, *args,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, input=stdin or "",
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert message.format(tmp=tmp_path.resolve()) in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_an_interpolation_that_does_not_resolve_exits_2_not_3(tmp_path):
    proc = run_cli(*QUICK, "prompt=cost ${oops}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "'prompt=cost ${oops}' does not resolve: Interpolation key 'oops' not found" in proc.stderr
    assert """'prompt="cost \\${oops}"'""" in proc.stderr and "Traceback" not in proc.stderr

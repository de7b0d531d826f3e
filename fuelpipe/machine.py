"""The machine a plan is built and measured on: its CPU model and the extensions that decide speed.

This project's machines differ (AMD EPYC with AVX2 only; Intel Xeon with
AVX-512 and AMX), and a speed measured on one says little about the other, so
every benchmark names the CPU and its vector / matrix extensions, and the
plan-cache key and kernel build digest name the whole flag set.
"""
from __future__ import annotations

import functools
import platform
from pathlib import Path

# The flags that change which kernels are fast (x86 names as /proc/cpuinfo spells them), in a readable order.
SPEED_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
               "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "sve")


@functools.cache
def cpu_model_and_flags() -> tuple[str, str]:
    """The CPU's model name and its sorted feature flags (``/proc/cpuinfo``; the platform's name elsewhere)."""
    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith(("flags", "Features")) and not flags:
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def cpu_name() -> str:
    return cpu_model_and_flags()[0]


def speed_extensions() -> list[str]:
    """The CPU's vector and matrix extensions among ``SPEED_FLAGS``, e.g. ['avx', 'avx2', 'fma', 'f16c']."""
    have = set(cpu_model_and_flags()[1].split())
    return [f for f in SPEED_FLAGS if f in have]


def describe_cpu() -> str:
    """'AMD EPYC (avx avx2 fma f16c)': the model and its speed extensions, for reports."""
    ext = speed_extensions()
    return f"{cpu_name()} ({' '.join(ext) if ext else 'no x86 vector extensions reported'})"

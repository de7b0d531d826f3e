"""Progress bars that show on a terminal and stay quiet in CI (CI set, or stderr not a tty)."""
from __future__ import annotations

import os
import sys

from tqdm import tqdm


def quiet() -> bool:
    ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    return ci or not sys.stderr.isatty()


def bar(total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="step", leave=False, file=sys.stderr, disable=quiet())

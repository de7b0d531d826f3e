"""One line of the planted-bugs record (``$FUELPIPE_PLANTED_RECORD``, JSON lines): what a study run caught."""
from __future__ import annotations

import json
import os
from pathlib import Path


def record(name: str, gate, caught, status: str, **extra) -> None:
    out = os.environ.get("FUELPIPE_PLANTED_RECORD")
    if out:
        with Path(out).open("a") as f:
            f.write(json.dumps({"bug": name, "gate": list(gate), "status": status, "caught_by": list(caught), **extra})
                    + "\n")

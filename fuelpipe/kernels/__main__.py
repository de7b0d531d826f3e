"""``python -m fuelpipe.kernels``: build fuelpipe's C++ kernels now (once per machine), not at the first run.

Prints where the library is and which vector path it takes; exits 1 with the compiler's message when the
build fails. A second call finds the built library and returns in about a second."""
from __future__ import annotations

import sys
import time


def main() -> int:
    from fuelpipe.kernels.build import KernelBuildError, load, vector_path

    start = time.perf_counter()
    try:
        path = load()
    except KernelBuildError as err:
        print(f"fuelpipe kernels: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fuelpipe kernels: interrupted (Ctrl-C); nothing was kept", file=sys.stderr)
        return 130
    print(f"fuelpipe kernels: {path} ({vector_path()} path), ready in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

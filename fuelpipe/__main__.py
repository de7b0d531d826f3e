import os
import sys

try:
    from fuelpipe.cli import main
except KeyboardInterrupt:  # Ctrl-C while torch and Hydra import (seconds): nothing ran
    print("fuelpipe: interrupted (Ctrl-C) while starting; nothing ran", file=sys.stderr, flush=True)
    # os._exit, not sys.exit: a half-imported torch's exit handlers must not run (seen: the process then
    # died of SIGINT instead of exiting 130), and nothing else ran that could need them
    os._exit(130)

main()

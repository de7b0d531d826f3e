import sys

try:
    from fuelpipe.cli import main
except KeyboardInterrupt:  # Ctrl-C while torch and Hydra import (seconds): nothing ran
    print("fuelpipe: interrupted (Ctrl-C) while starting; nothing ran", file=sys.stderr)
    sys.exit(130)

main()

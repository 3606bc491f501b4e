"""`python -m specdraft.trainer.disagg.capture`: the embedded capture server (see `main`)."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m specdraft.trainer.disagg.consumer`: this node's trainer ranks (see `main`)."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())

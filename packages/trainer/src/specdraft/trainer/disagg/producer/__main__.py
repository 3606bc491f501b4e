"""`python -m specdraft.trainer.disagg.producer`: the producer process (see `main`)."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m specdraft.cli` runs the `specdraft` command."""

from .main import main

if __name__ == "__main__":
    main()

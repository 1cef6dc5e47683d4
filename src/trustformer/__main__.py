"""``python -m trustformer``: the same command line as ``trustformer``."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())

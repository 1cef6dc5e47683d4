"""``python -m trustformer``: the ``trustformer`` command."""

import sys

from .cli import main

sys.exit(main())

"""``python -m vit_flowers.app``: runs :func:`vit_flowers.app.command.main`."""

import sys

from .command import main

if __name__ == "__main__":
    sys.exit(main())

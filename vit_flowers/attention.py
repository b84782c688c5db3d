"""The old name of the ``explain`` command: ``python -m vit_flowers.attention`` keeps working."""

import sys

from .explain import main

if __name__ == "__main__":
    sys.exit(main())

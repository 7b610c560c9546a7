"""``python -m milegpo`` is the ``milegpo`` command (what ``torchrun -m milegpo`` launches)."""

import sys

from milegpo.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m milegpo.cli`` is the ``milegpo`` command."""

import sys

from milegpo.cli import main

if __name__ == "__main__":
    sys.exit(main())

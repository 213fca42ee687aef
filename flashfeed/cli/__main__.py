"""``python -m flashfeed.cli``: the ``flashfeed`` command."""

import sys

from flashfeed.cli import main

if __name__ == "__main__":
    sys.exit(main())

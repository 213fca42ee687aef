"""``python -m flashfeed.cli``: the ``flashfeed`` command."""

import sys

from flashfeed.cli.main import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m flashfeed.cli``: the ``flashfeed`` command."""

import sys

from flashfeed.cli.main import main

sys.exit(main())

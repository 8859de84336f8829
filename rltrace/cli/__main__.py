"""``python -m rltrace.cli``: the ``rltrace`` command."""

import sys

from rltrace.cli.main import main

sys.exit(main())

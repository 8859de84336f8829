"""``python -m rltrace.cli``: the ``rltrace`` command."""

import sys

from .main import main

sys.exit(main())

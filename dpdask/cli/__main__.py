"""``python -m dpdask.cli``: the ``dpdask`` command line."""

import sys

from dpdask.cli import main

sys.exit(main())

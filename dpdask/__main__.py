"""``python -m dpdask``: the command line (:mod:`dpdask.cli`)."""

from dpdask.cli import main

raise SystemExit(main())

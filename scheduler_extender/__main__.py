"""``python -m scheduler_extender``: start the extender."""

from scheduler_extender.cli import main

raise SystemExit(main())

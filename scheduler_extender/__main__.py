"""``python -m scheduler_extender``: start the extender."""

from scheduler_extender.cli.main import main

raise SystemExit(main())

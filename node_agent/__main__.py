"""``python -m node_agent``: run the node agent."""

from node_agent.cli import main

raise SystemExit(main())

"""Telemetry: the push contract (``schema``), the store of the latest reports, the clock."""

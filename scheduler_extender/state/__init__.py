"""What the extender knows, in the shape decisions need.

A columnar node table, GPU assignments (the assume cache of bind), and the ``ClusterState``
that keeps them consistent. Imports ``telemetry``, ``policy`` and ``domain``; no web framework.
"""

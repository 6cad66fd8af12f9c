"""edgegpu scheduler extender: a GPU-aware kube-scheduler extender.

Imports nothing heavy: the node agent imports ``scheduler_extender.telemetry.schema``.
"""

__version__ = "0.1.0"

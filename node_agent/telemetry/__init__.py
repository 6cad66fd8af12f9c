"""The agent's telemetry: what it reads of every GPU and where it goes.

Sampling, the report pushed to the extenders (DESIGN.md §3), the Prometheus metrics, and the
map from a GPU process to its pod.
"""

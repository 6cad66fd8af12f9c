"""Replay of the Alibaba OpenB GPU-sharing trace, as the FGD paper's simulator runs it.

``trace`` loads nodes and pods and builds the 130 % workload, ``frag`` is the fragmentation
measure, ``policies`` the six published baselines, ``ours`` our extender's policy through its
own verdict functions, ``replay`` the one-attempt-per-pod scheduling loop and ``report`` the
table, JSON and figure. ``python -m benchmarks.openb --help`` runs it.
"""

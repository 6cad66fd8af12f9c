"""Command lines.

The extender (``main``), the flag parsing it shares with the agent (``flags``), and the
``kubectl edgegpu`` plugin (``kubectl``).
"""

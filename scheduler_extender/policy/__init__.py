"""Pure scheduling rules: thermal, power, QoS, memory, topology, staleness, and how they combine.

No I/O, no clock reads, no web, HTTP, settings or metrics frameworks, and no other extender
subpackage: every input (time included) is passed in. numpy arrays are the unit of work, so that
one call decides for every candidate node at once.
"""

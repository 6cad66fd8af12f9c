"""Local protection of the node's GPUs, which never waits for the cloud.

Health, power plans and their application, the extender's policy held within the agent's flags,
its self-test and reboot asks, and the self-test tools.
"""

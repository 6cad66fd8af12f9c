"""The agent's link to the extender replicas.

Its pushes, their typed answers, the node's GPU assignments they list, and the CA their
certificates are checked against.
"""

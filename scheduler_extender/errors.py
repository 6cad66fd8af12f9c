"""The extender's error tree. Imports nothing from the rest of the package.

A problem with one node is never an exception: it is a reason in ``FailedNodes``.
These are for problems with a whole request, a whole document or the process.
"""


class ExtenderError(Exception):
    """Root of every error the extender raises on purpose."""


class PolicyError(ExtenderError):
    """A policy document is invalid; ``errors`` lists every problem found."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("invalid GPUSchedulingPolicy: " + "; ".join(errors))


class RequestError(ExtenderError):
    """A scheduler request cannot be understood (bad JSON, wrong types, bad pod spec)."""


class BindError(ExtenderError):
    """A bind could not be carried out."""

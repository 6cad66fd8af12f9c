"""The agent's error tree; backends turn their library's errors into these."""


class AgentError(Exception):
    """Root of every error the agent raises on purpose."""


class BackendUnavailable(AgentError):
    """The backend cannot start here (no driver, no library, no device); fatal at start-up."""


class DeviceLost(AgentError):
    """One GPU stopped answering (fell off the bus); its siblings carry on."""


class NotSupported(AgentError):
    """The GPU or backend cannot do this; reported once, never retried."""


class PermissionDenied(AgentError):
    """The agent lacks the privilege for a setter; reported, not retried."""

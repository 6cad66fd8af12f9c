"""The CA that signed the extender's certificate, from a file that may appear late.

An https push or assignments lookup is made only once it is read (``ExtenderCa.ready``).
Imports the standard library.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

log = logging.getLogger("node_agent.push")


class ExtenderCa:
    """The CA that signed the extender's certificate, from a file that may appear late.

    ``context`` checks every certificate against this CA alone, and the host name too: until
    the file can be read it trusts no certificate, and no https push is made (``ready``). Once
    read, the CA is kept while the agent runs.
    """

    def __init__(self, ca_file: Path) -> None:
        self.ca_file = ca_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # host name and chain checked
        # The checks ssl.create_default_context makes, without the CAs it loads.
        self.context.verify_flags = ssl.create_default_context().verify_flags
        self.loaded = False
        self._said = ""

    def ready(self) -> str | None:
        """None once the CA is loaded; else why https pushes are off. Reads the file again.

        The first failure is logged, and each new one; the recovery once.
        """
        if self.loaded:
            return None
        try:
            # The whole file is read into a scratch context first: a file the context takes
            # only part of must not leave it half loaded.
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=self.ca_file)
            self.context.load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError, ValueError) as exc:
            why = f"ca_file {self.ca_file} cannot be read ({_reason(exc)})"
            if why != self._said:
                log.error("%s: no push to an https extender until it can be (it is read "
                          "again at every push); local protection goes on", why)  # fmt: skip
                self._said = why
            return why
        self.loaded = True
        if self._said:
            log.warning("ca_file %s read: pushing to https extenders", self.ca_file)
        return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__

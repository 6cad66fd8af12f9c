"""Kubernetes adapters: the extender v1 wire format and pod-spec translation (no API client yet)."""

"""The HTTP service: ``create_app`` and one router per concern.

Routers: scheduler verbs, telemetry ingest, debug and ops endpoints.
"""

"""Property-based fuzzing of every route of the extender's OpenAPI document (schemathesis).

A fixed-seed run of ``EDGEGPU_FUZZ_CASES`` cases per operation (a few by default, as part of
``make test``; ``make fuzz`` raises it). A case fails on a server error (5xx), a status code or
a response the document does not describe, or a request that takes longer than
``CASE_TIMEOUT_S`` (a hang).

The app is the one a cluster would reach, with what lets the fuzzer in past the front door:
pushes carry a static agent token (so report bodies are decoded, not refused 403 for want of
one), and /debug/* is open to the fuzzer's client (which is not a loopback address).
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from scheduler_extender.api.app import create_app
from scheduler_extender.config import ExtenderSettings

CASES = int(os.environ.get("EDGEGPU_FUZZ_CASES", "25"))
CASE_TIMEOUT_S = 10
AGENT_TOKEN = "fuzz-agent-token"
"""A static token that may report for any node, sent with every case."""


def _app() -> FastAPI:
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens"
        tokens.write_text(f"{AGENT_TOKEN} *\n")  # read once, as the app is built
        return create_app(ExtenderSettings(debug_endpoints="on", static_token_file=tokens))


app = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
CHECKS = (
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)


RAN: dict[str, int] = {"cases": 0, "operations": 0}
SUMMARY = pytest.StashKey[str]()


@pytest.fixture(scope="module", autouse=True)
def count(request: pytest.FixtureRequest) -> Iterator[None]:
    """Say how many cases ran (hypothesis stops early on routes with few distinct inputs)."""
    yield
    line = (
        f"fuzz: {RAN['cases']} cases over {RAN['operations']} operations, up to {CASES} each, "
        "fixed seed"
    )
    request.config.stash[SUMMARY] = line


class Hang(Exception):
    """A request that did not finish within ``CASE_TIMEOUT_S``."""


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    def alarm(*_: Any) -> None:
        raise Hang(f"a request took longer than {CASE_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def operation() -> None:
    RAN["operations"] += 1


@schema.parametrize()
@settings(
    max_examples=CASES,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_no_route_errs_or_answers_off_its_schema(case: Any) -> None:
    RAN["cases"] += 1
    signal.alarm(CASE_TIMEOUT_S)
    try:
        case.call_and_validate(checks=CHECKS, headers={"Authorization": f"Bearer {AGENT_TOKEN}"})
    finally:
        signal.alarm(0)


def test_the_fuzzed_document_covers_the_verbs_and_the_push() -> None:
    operations = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    fast = {("POST", f"/{verb}") for verb in ("filter", "prioritize", "preempt", "bind")}
    assert fast | {("POST", "/v1/telemetry"), ("POST", "/debug/explain")} <= operations

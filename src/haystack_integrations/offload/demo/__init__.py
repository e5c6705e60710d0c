"""The scripted multi-tenant demo behind ``offload-haystack demo``: no cloud account, no API key."""

from haystack_integrations.offload.demo.runner import (
    DemoReport,
    SessionOutcome,
    run_demo,
    run_demo_async,
    session_marker,
)

__all__ = ["DemoReport", "SessionOutcome", "run_demo", "run_demo_async", "session_marker"]

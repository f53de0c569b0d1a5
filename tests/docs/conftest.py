"""The opt-in documented commands (marker ``docs_optin``) run only when asked for: ``pytest -m docs_optin`` (what
``make test-docs-optin`` runs); otherwise they are deselected, like the suite's other opt-in markers."""

from __future__ import annotations

import pytest

MARKER = "docs_optin"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: a documented command that needs Gemma 3 270M, Ray, extras or a long run (make test-docs-optin)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if MARKER in (config.option.markexpr or ""):
        return
    deselected = [item for item in items if item.get_closest_marker(MARKER) is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker(MARKER) is None]

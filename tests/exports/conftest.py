"""The session's Optimum exports (tests/exports/optimum_exports.py), each made once, on first use."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # imported here: a test file that needs optimum-onnx imports optimum_exports itself and is skipped whole,
    # with the reason, where it is missing
    from optimum_exports import Exports

    return Exports(tmp_path_factory.mktemp("optimum-exports"))

"""OpenVINO's execution provider: onnxruntime-openvino replaces the onnxruntime package, so these tests run in an
environment of their own (make test-openvino: build/venv-openvino, from the wheels in dist/); where the provider is not
installed they skip, saying so.
"""

from __future__ import annotations

import onnxruntime as ort
import pytest

#: onnxruntime's name of the provider under test
OPENVINO = "OpenVINOExecutionProvider"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if OPENVINO in ort.get_available_providers():
        return
    skip = pytest.mark.skip(
        reason=f"{OPENVINO} is not in this onnxruntime ({ort.get_available_providers()}): these tests run in "
        "make test-openvino's environment, with onnxruntime-openvino in place of onnxruntime"
    )
    for item in items:
        if "tests/openvino/" in str(item.path).replace("\\", "/"):
            item.add_marker(skip)

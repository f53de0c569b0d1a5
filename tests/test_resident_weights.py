"""decoctl.model._resident: a model's mapped weight files made resident at once (decoctl serve's default)."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest

from decoctl.model._resident import file_mappings, populate

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def _resident_kib(start: int) -> int:
    """The Rss of the mapping that starts at ``start``, from /proc/self/smaps."""
    found = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                found = int(head[0].split("-")[0], 16) == start
            elif found and head[0] == "Rss:":
                return int(head[1])
    raise AssertionError(f"no mapping at {start:#x}")


def test_populate_faults_in_every_page_of_a_files_mapping(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    data = folder / "model.onnx.data"
    data.write_bytes(bytes(range(256)) * (4 << 12))  # 4 MiB
    other = tmp_path / "elsewhere.bin"
    other.write_bytes(b"\1" * (1 << 20))
    with data.open("rb") as f, other.open("rb") as g:
        weights = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        outside = mmap.mmap(g.fileno(), 0, prot=mmap.PROT_READ)
        try:
            mappings = file_mappings(folder)
            assert [(end - start, path) for start, end, path in mappings] == [(4 << 20, str(data.resolve()))]
            start = mappings[0][0]
            assert _resident_kib(start) < 4096  # untouched: not (all) resident
            report = populate(folder)
            assert report is not None and report.mappings == 1 and report.bytes == 4 << 20
            assert _resident_kib(start) == 4096
            assert all(path != str(other.resolve()) for _, _, path in file_mappings(folder))
        finally:
            weights.close()
            outside.close()


def test_a_folder_nothing_maps_is_a_no_op(tmp_path: Path) -> None:
    report = populate(tmp_path)
    assert report is not None and report.mappings == 0 and report.bytes == 0


def test_file_mappings_reads_only_readable_mappings_under_the_folder(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0000002000 r--p 00000000 08:01 12 /models/gemma/model.onnx.data\n"
        "7f0000002000-7f0000003000 ---p 00000000 08:01 12 /models/gemma/model.onnx.data\n"
        "7f0000003000-7f0000004000 r--p 00000000 08:01 13 /models/gemma-other/model.onnx.data\n"
        "7f0000004000-7f0000005000 rw-p 00000000 00:00 0 \n"
        "7f0000005000-7f0000006000 r--p 00000000 08:01 14 /models/gemma/sub/extra.bin\n"
    )
    found = file_mappings("/models/gemma", maps=str(maps))
    assert found == [
        (0x7F0000000000, 0x7F0000002000, "/models/gemma/model.onnx.data"),
        (0x7F0000005000, 0x7F0000006000, "/models/gemma/sub/extra.bin"),
    ]

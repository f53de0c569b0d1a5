"""A model folder's MatMuls quantized to 8-bit weight blocks (MatMulNBits), as onnxruntime-genai's builder writes an
``-p int8 -e cpu`` export: what decoctl's tests run where a real int8 model (Gemma 3 270M int8) cannot be had."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import onnx

__all__ = ["quantize_int8"]


def quantize_int8(
    source: str | Path, destination: str | Path, *, accuracy_level: int = 4, block_size: int = 32
) -> Path:
    """Copy the model folder ``source`` (onnxruntime-genai's layout, as ``build_genai_model`` writes it) to
    ``destination`` with every MatMul (the LM head's too) replaced by a MatMulNBits of 8-bit symmetric weight blocks
    (onnxruntime.quantization's MatMulNBitsQuantizer, the quantizer the builder calls).

    :param accuracy_level: MatMulNBits' ``accuracy_level``: 4 (the builder's default on CPU) quantizes each row's
        activations to int8 blocks and multiplies in integers; 0 dequantizes the weights and multiplies in float32.
    :param block_size: weights per quantization block along the input dimension (the builder's default is 32).
    """
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    source, destination = Path(source), Path(destination)
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(source, destination)
    model = onnx.load(str(source / "model.onnx"))
    config = DefaultWeightOnlyQuantConfig(
        block_size=block_size, is_symmetric=True, accuracy_level=accuracy_level, bits=8
    )
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    # the quantizer logs a line per node at INFO through the root logger's handlers
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        quantizer.process()
    finally:
        quiet.setLevel(level)
    for stale in destination.glob("model.onnx*"):
        stale.unlink()
    onnx.save(quantizer.model.model, str(destination / "model.onnx"))
    return destination

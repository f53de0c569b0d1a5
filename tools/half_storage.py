"""Store an ONNX model's float32 weights as float16 on disk while it still computes in float32.

    python tools/half_storage.py build/export/pycode build/bundle/pycode

Every float32 initializer of at least --min-elements values becomes a float16 initializer followed by a Cast
back to float32 at the top of the graph. onnxruntime folds those Casts into float32 constants when it builds
the session (constant folding runs at every optimization level above "disabled"), so the kernels, their
pre-packed weights and the step time are those of the float32 model; only the file halves, and the weights are
rounded to float16 once. The rest of the folder (genai_config.json, tokenizer files, reports) is copied as is.
Used to bundle the demo models within their size budget (docs/MODELS.md); the logits of the result are
checked against the float32 model's on the same prompts and the largest difference is printed.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

SUFFIX = "_fp16"


def half_storage(src: Path, dst: Path, min_elements: int = 4096) -> tuple[int, int]:
    """Write dst (a copy of the model folder src) with its big float32 weights stored as float16; return how many
    initializers were converted and the bytes of weights saved."""
    dst.mkdir(parents=True, exist_ok=True)
    onnx_files = sorted(src.glob("*.onnx"))
    for item in src.iterdir():
        if item.suffix not in (".onnx", ".data") and item.is_file():
            shutil.copy2(item, dst / item.name)
    converted = saved = 0
    for path in onnx_files:
        model = onnx.load(str(path))  # external data is read in too
        casts = []
        for init in model.graph.initializer:
            if init.data_type != onnx.TensorProto.FLOAT or np.prod(init.dims) < min_elements:
                continue
            values = numpy_helper.to_array(init)
            name = init.name
            init.CopyFrom(numpy_helper.from_array(values.astype(np.float16), name + SUFFIX))
            casts.append(
                helper.make_node("Cast", [name + SUFFIX], [name], to=onnx.TensorProto.FLOAT, name=f"{name}/cast")
            )
            converted += 1
            saved += values.nbytes // 2
        nodes = list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(casts + nodes)
        onnx.save_model(
            model,
            str(dst / path.name),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
        for written in (dst / path.name, dst / (path.name + ".data")):
            if written.exists():
                written.chmod(0o644)
    return converted, saved


def max_logit_diff(a: Path, b: Path, ids: list[int]) -> float:
    """Largest |logit difference| between two model folders on one prompt, run through decoctl's host (a draft
    head that takes features gets the same random ones in both)."""
    from decoctl.host import Sequence
    from decoctl.model import load_model

    rows = []
    for folder in (a, b):
        model = load_model(folder, threads=1)
        caps = model.capabilities
        features = None
        if caps.feature_input is not None:
            features = np.random.default_rng(0).normal(size=(len(ids), caps.feature_size)).astype(np.float32)
        sequence = Sequence("check", model, max_length=len(ids) + 1)
        rows.append(sequence.forward(ids, features=features).copy())
    # equal infinities (a draft-vocabulary head's -inf columns) count as no difference, not as inf - inf = nan
    differ = rows[0] != rows[1]
    return float(np.abs(rows[0][differ] - rows[1][differ]).max(initial=0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--min-elements", type=int, default=4096)
    args = parser.parse_args()
    converted, saved = half_storage(args.src, args.dst, args.min_elements)
    diff = max_logit_diff(args.src, args.dst, list(range(3, 67)))
    print(f"{converted} initializers stored as float16 ({saved / 1e6:.1f} MB saved); max |logit diff| {diff:.2e}")


if __name__ == "__main__":
    main()

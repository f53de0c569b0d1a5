"""The inputs of the LoRA serving bench (docs/ADAPTERS.md: 4 adapters x 16 concurrent requests against the base model
alone) on Gemma 3 270M int8: the imported model with LoRA slots on every layer's attention projections, and 4 random
adapters of rank 16. Dev-time only; runs in .venv (decoctl with onnx).

    .venv/bin/python tools/lora_bench_model.py                          # build/lora-bench/
    .venv/bin/python tools/lora_bench_model.py --model PATH --out DIR --rank 16 --adapters 4

Writes OUT/gemma3-270m-int8-lora (decoctl models add-lora-slots --targets q_proj,k_proj,v_proj,o_proj: the builder
packs q, k and v into qkv_proj, each gets a slot of its own) and OUT/a1.onnx_adapter .. a4.onnx_adapter. The adapters'
values come from fixed seeds (A ~ N(0, 1/in), B ~ N(0, 0.02^2)): small enough to keep the model's text readable,
large enough to change its greedy tokens. Then serve and measure as docs/ADAPTERS.md says:

    decoctl serve -m OUT/gemma3-270m-int8-lora --name base --adapter a1=OUT/a1.onnx_adapter ... --port 8000
    decoctl serve -m gemma3-270m-int8 --name base --port 8001
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from decoctl.model._adapters import write_adapter
from decoctl.model.graph._lora_slots import add_lora_slots, lora_slots

ROOT = Path(__file__).resolve().parent.parent
MODEL = Path.home() / ".local/share/decoctl/models/gemma3-270m-int8"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL, help=f"the imported model folder (default {MODEL})")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "lora-bench")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=4)
    args = parser.parse_args(argv)
    folder = args.out / f"{args.model.name}-lora"
    if folder.exists():
        sys.exit(f"{folder} exists: remove it to write it again")
    slots = add_lora_slots(args.model, folder, TARGETS)
    declared = lora_slots(folder)
    for index in range(1, args.adapters + 1):
        rng = np.random.default_rng(index)
        parameters = {}
        for slot in slots.values():
            dtype = np.dtype(declared[slot.a][0])
            a = rng.normal(0.0, 1.0 / np.sqrt(slot.fan_in), (slot.fan_in, args.rank))
            parameters[slot.a] = a.astype(dtype)
            parameters[slot.b] = rng.normal(0.0, 0.02, (args.rank, slot.width)).astype(dtype)
        path = write_adapter(args.out / f"a{index}.onnx_adapter", parameters)
        sys.stdout.write(f"{path}\n")
    sys.stdout.write(f"{folder}: {len(slots)} slots\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

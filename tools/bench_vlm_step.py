"""A vision-language decode step against the text-only decoder's step, side by side in one process.

    python tools/bench_vlm_step.py build/tiny-llava --threads 1 --repeats 7

Builds decoctl.testing.vlm's tiny LLaVA under the folder if it is not there, exports its text model alone with
onnxruntime-genai's builder (the same weights taking token ids), and times greedy decoding on both, alternating
which goes first: the VLM after an image, the text-only twin on the same text. Reports decode tokens/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

import decoctl
from decoctl.plugins import PluginRegistry
from decoctl.testing.vlm import build_llava

TEXT = "\nUSER: describe the picture in detail. ASSISTANT:"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=200)
    args = parser.parse_args()
    if not (args.folder / "onnx" / "genai_config.json").is_file():
        build_llava(args.folder)
    twin = args.folder / "text-twin"
    if not (twin / "genai_config.json").is_file():
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(args.folder / "text")]
        command += ["-o", str(twin), "-p", "fp32", "-e", "cpu", "-c", str(args.folder / "builder-cache")]
        subprocess.run(command, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    registry = PluginRegistry(autoload=False)
    vlm = decoctl.Generator({"target": args.folder / "onnx"}, "greedy", registry=registry, threads=args.threads)
    text = decoctl.Generator({"target": twin}, "greedy", registry=registry, threads=args.threads)
    image = Path(__file__).parent.parent / "docs" / "bench-host-small.png"
    speeds: dict[str, list[float]] = {"vlm": [], "text": []}
    for repeat in range(args.repeats):
        for name in ("vlm", "text") if repeat % 2 == 0 else ("text", "vlm"):
            if name == "vlm":
                result = vlm.generate("<image>" + TEXT, images=[image], max_new_tokens=args.max_new_tokens)
            else:
                result = text.generate(TEXT, max_new_tokens=args.max_new_tokens)
            speeds[name].append(result.stats.tokens_per_second)
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    for name, values in speeds.items():
        print(f"{name:>4}: {medians[name]:.0f} decode tok/s (median of {len(values)})")
    print(f"vlm / text: {medians['vlm'] / medians['text']:.3f}")


if __name__ == "__main__":
    main()

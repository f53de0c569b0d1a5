"""A trained head as the ONNX head the eagle controller runs: written by decoctl.model.eagle_graph, checked against
the torch head, and recorded with what it was trained for.

The check runs the written folder through decoctl's own runtime (a Sequence with features) on random token ids and
random features of the trained features' scale, both as one pass and as a prefix followed by one token at a time
through its KV cache, and compares logits and hidden_states with the torch head's ``reference``. For an EAGLE-3 head
the first rows carry taps (``[taps | 0]``) and the rest the head's own kind of feature (``[0 | own]``), as drafting
feeds them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from decoctl import ConfigError, Sequence, load_model
from decoctl.model.eagle_graph import EAGLE3, write_head
from decoctl_eagle.training.model import Head

__all__ = ["TOLERANCE", "check_against_torch", "export_head"]

#: the largest |logit| difference accepted between the ONNX head and torch, relative to the logits' scale (>= 1)
TOLERANCE = 1e-4


def export_head(
    head: Head,
    folder: Path,
    *,
    target_dir: Path,
    target_name: str,
    feature_scale: float,
    training: Mapping[str, Any],
    seed: int = 0,
) -> dict[str, Any]:
    """Write the head to ``folder`` (replaced whole), check it against torch, add ``training`` to its config's
    ``decoctl`` section and write ``export_report.json``. Returns the report; ConfigError when the check fails."""
    staging = folder.with_name(f".{folder.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    head.eval()
    source = f"decoctl eagle train ({training.get('out', folder.parent)})"
    write_head(staging, head.dims, head.onnx_weights(), target_dir=target_dir, target_name=target_name, source=source)
    gaps = check_against_torch(head, staging, feature_scale=feature_scale, seed=seed)
    config_path = staging / "genai_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.setdefault("decoctl", {})["training"] = dict(training)
    config_path.write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    report = {"max_abs_diff": gaps, "tolerance": TOLERANCE, "training": dict(training)}
    (staging / "export_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if gaps["logits"] > TOLERANCE * max(1.0, gaps["logit_scale"]):
        raise ConfigError(
            f"the exported head's logits differ from the torch head's by {gaps['logits']:.2e} (more than "
            f"{TOLERANCE:g} of their scale {gaps['logit_scale']:.1f}): the export is wrong, please report it; the "
            f"folder is left at {staging}"
        )
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)
    return report


def check_against_torch(head: Head, folder: Path, *, feature_scale: float, seed: int = 0) -> dict[str, float]:
    """max |ONNX - torch| of logits (finite entries; the -inf ones must match) and hidden_states, in one pass and
    step by step, on random inputs; and the logits' largest magnitude (``logit_scale``)."""
    dims = head.dims
    rng = np.random.default_rng(seed)
    n = 12
    ids = rng.integers(0, dims.vocab, n)
    features = (rng.standard_normal((n, dims.feature_size)) * feature_scale).astype(np.float32)
    if dims.architecture == EAGLE3:
        taps = 3 * dims.hidden
        features[: n // 2, taps:] = 0.0
        features[n // 2 :, :taps] = 0.0
    with torch.no_grad():
        want_logits, want_hidden = (
            t.numpy() for t in head.reference(torch.from_numpy(ids), torch.from_numpy(features))
        )
    sequence = Sequence("eagle", load_model(folder, threads=1))
    got_logits = np.array(sequence.forward(ids, features=features))
    got_hidden = np.array(sequence.hidden_states())
    gaps = {
        "logits": _gap(got_logits, want_logits),
        "hidden_states": float(np.abs(got_hidden - want_hidden).max()),
        "logits_step_by_step": 0.0,
        "logit_scale": float(np.abs(want_logits[np.isfinite(want_logits)]).max()),
    }
    half = n // 2
    sequence.rewind(0)
    sequence.forward(ids[:half], features=features[:half])
    for i in range(half, n):
        row = np.array(sequence.forward(ids[i : i + 1], features=features[i : i + 1]))
        gaps["logits_step_by_step"] = max(gaps["logits_step_by_step"], _gap(row, want_logits[i : i + 1]))
    gaps["logits"] = max(gaps["logits"], gaps["logits_step_by_step"])
    return gaps


def _gap(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over finite entries; inf where the -inf entries (tokens outside the draft vocabulary)
    differ."""
    masked = ~np.isfinite(want)
    if (~np.isfinite(got) != masked).any():
        return float("inf")
    return float(np.abs(got[~masked] - want[~masked]).max())

"""Whether this onnxruntime keeps the ring caches a graph asks for, found by running it (no file can tell).

A GroupQueryAttention node with ``sliding_window_cache=1`` is bound a window-sized buffer and evicts as the window
moves (decoctl.model._ring_cache). An onnxruntime whose kernel predates the attribute ignores it, and one whose
eviction differs from the layout decoctl keeps gives other attention than the model's: either way the export
would run past its window with wrong tokens, or fail in the kernel. ``probe_rings`` feeds the same synthetic
tokens, past the window and through evictions, once over ring buffers and once over full-length buffers (which
the kernel never evicts from), and refuses the export (ModelLoadError) where their logits differ.
"""

from __future__ import annotations

import attrs
import numpy as np

from decoctl.errors import ModelLoadError
from decoctl.logs import get_logger
from decoctl.model._kv_cache import make_kv_cache
from decoctl.model._loader import LoadedModel
from decoctl.model._runner import Runner

__all__ = ["PROBE_MAX_WINDOW", "probe_rings"]

log = get_logger(__name__)

#: kernel windows up to this many positions are probed at load (a prompt of that length, twice); a larger one is
#: logged as not probed, since its probe would cost as much as a long prompt on every load
PROBE_MAX_WINDOW = 1024
#: single-token steps after the window is full: each one evicts (the probe's rings keep no slack)
_STEPS = 3
#: logits of the two runs may differ by summation order only
_TOLERANCE = 1e-3


def probe_rings(model: LoadedModel) -> None:
    """Run ``model``'s ring layers past their window over ring and over full-length buffers; raise ModelLoadError
    where the logits differ or the ring run fails in onnxruntime. A model without ring layers, or a composite one
    (whose decoder does not take token ids alone), is left as it is."""
    rings = model.capabilities.rings
    if not rings or model.encoder is not None or model.vision is not None or model.prefill is not None:
        return
    spec = model.spec
    window = max(r.kernel_window for r in rings)
    length = window + _STEPS
    if length > min(spec.max_length, spec.context_length):
        return  # the rings never evict: nothing the kernel does differs from a full-length cache
    if window > PROBE_MAX_WINDOW:
        log.info("decoctl.ring_probe_skipped", model=str(spec.path), kernel_window=window, limit=PROBE_MAX_WINDOW)
        return
    tight = tuple(attrs.evolve(r, slack=0) for r in rings)  # capacity = kernel window: every step evicts
    ring = Runner(model, max_length=length, kv=make_kv_cache(model.session, spec, length, tight))
    full = Runner(model, max_length=length, kv=make_kv_cache(model.session, spec, length))
    tokens = (np.arange(length, dtype=np.int64) * 7 + 3) % spec.vocab_size
    prompt, steps = tokens[:window], tokens[window:]
    try:
        got = [ring.run(prompt, keep=1).logits[-1].copy()]
        got += [ring.run(steps[i : i + 1]).logits[-1].copy() for i in range(_STEPS)]
    except Exception as exc:  # onnxruntime's own error types: the kernel refused the window-sized buffers
        raise ModelLoadError(_message(model, f"fails in onnxruntime ({type(exc).__name__}: {exc})")) from exc
    expected = [full.run(prompt, keep=1).logits[-1].copy()]
    expected += [full.run(steps[i : i + 1]).logits[-1].copy() for i in range(_STEPS)]
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(got, expected, strict=True))
    scale = max(1.0, max(float(np.max(np.abs(b))) for b in expected))
    if not worst <= _TOLERANCE * scale:
        raise ModelLoadError(
            _message(model, f"gives other logits than over full-length buffers (by up to {worst:.3g})")
        )
    log.debug("decoctl.ring_probe_ok", model=str(spec.path), kernel_window=window, difference=worst)


def _message(model: LoadedModel, what: str) -> str:
    import onnxruntime as ort

    layers = [r.layer for r in model.capabilities.rings]
    return (
        f"{model.spec.onnx_file}: layers {layers} keep window-sized ring caches (GroupQueryAttention's "
        f"sliding_window_cache=1), and a forward past the window over them {what}: onnxruntime {ort.__version__}'s "
        "kernel does not keep the ring as the graph asks, so the model's tokens would be wrong past its window. "
        "Run it with the onnxruntime that onnxruntime-genai's builder targets, or export it without ring caches "
        "(the builder's --extra_options windowed_kv_cache=false: full-length caches, the same window)"
    )

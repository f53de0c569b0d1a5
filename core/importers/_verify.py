"""Is a converted model the model it came from? First-token logits compared with a tolerance.

The comparison is pure (arrays in, a verdict out) so it is tested without any model; the importers feed it the
reference framework's logits and the ONNX graph's logits for the same prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from decoctl.errors import ModelLoadError

__all__ = ["LogitsCheck", "compare_logits", "require_all"]


@attrs.frozen(kw_only=True)
class LogitsCheck:
    """One prompt's verdict: the largest absolute difference, whether the top token agrees, the tolerance."""

    prompt: str
    max_abs_diff: float
    top1_match: bool
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def describe(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        top = "same top-1 token" if self.top1_match else "different top-1 token"
        return f"{self.prompt!r}: max |diff| {self.max_abs_diff:.2e} (tolerance {self.tolerance:g}), {top}: {verdict}"


def compare_logits(prompt: str, reference: np.ndarray, candidate: np.ndarray, *, tolerance: float) -> LogitsCheck:
    """Compare two logits rows for the same next position.

    :param reference: float[vocab] from the source model.
    :param candidate: float[vocab] from the converted model.
    :param tolerance: the largest absolute difference still accepted.
    """
    ref = np.asarray(reference, np.float64).reshape(-1)
    got = np.asarray(candidate, np.float64).reshape(-1)
    if ref.shape != got.shape:
        raise ModelLoadError(
            f"verifying {prompt!r}: the converted model gives {got.size} logits but the source gives {ref.size}: "
            "the export used another vocabulary; convert again"
        )
    if not np.isfinite(got).all():
        return LogitsCheck(prompt=prompt, max_abs_diff=float("inf"), top1_match=False, tolerance=tolerance)
    return LogitsCheck(
        prompt=prompt,
        max_abs_diff=float(np.max(np.abs(ref - got))),
        top1_match=bool(ref.argmax() == got.argmax()),
        tolerance=tolerance,
    )


def require_all(checks: Sequence[LogitsCheck], *, model: str) -> None:
    """Raise ModelLoadError listing every failed prompt, or return when all are within tolerance."""
    failed = [check for check in checks if not check.ok]
    if failed:
        details = "; ".join(check.describe() for check in failed)
        raise ModelLoadError(
            f"the converted {model} does not match its source ({details}): the conversion is broken; report it "
            "with the versions of transformers and onnxruntime-genai, or convert again with --force"
        )

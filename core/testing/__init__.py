"""Test helpers shipped with decoctl: tiny random-weight ONNX language models and their tokenizer.

Everything is built on the fly from a seed, without torch and without downloads, for the tests of the host and
of plugin distributions::

    from decoctl.testing import build_genai_model, reference_logits

    folder = build_genai_model(tmp_path / "target", seed=1, hidden_states=True)
    expected = reference_logits(folder, [0, 17, 42])  # float32[3, vocab]
    head = build_eagle_head(tmp_path / "eagle", folder, seed=2)  # an EAGLE draft head for that target

The models are written with the onnx package and sampling is checked with scipy, which decoctl itself does not
need: they come with the extra, ``pip install 'decoctl[testing]'``.
"""

try:
    import onnx  # noqa: F401  # checked here so that every submodule's import fails with the same message
except ImportError as _missing:
    raise ImportError(
        f"decoctl.testing builds its models with the onnx package, which is not installed ({_missing}): "
        "pip install 'decoctl[testing]'"
    ) from _missing

from decoctl.testing.eagle import build_eagle_head, write_eagle_head
from decoctl.testing.greedy import TIE_GAP, assert_greedys_tokens, first_divergence_is_a_tie
from decoctl.testing.models import (
    build_genai_model,
    build_optimum_model,
    reference_logits,
    reference_outputs,
    top2_gap,
)
from decoctl.testing.tokenizer import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    SPECIAL_TOKENS,
    build_tokenizer,
)

__all__ = [
    "BOS_TOKEN_ID",
    "EOS_TOKEN_ID",
    "PAD_TOKEN_ID",
    "SPECIAL_TOKENS",
    "TIE_GAP",
    "assert_greedys_tokens",
    "build_eagle_head",
    "build_genai_model",
    "build_optimum_model",
    "build_tokenizer",
    "first_divergence_is_a_tie",
    "reference_logits",
    "reference_outputs",
    "top2_gap",
    "write_eagle_head",
]

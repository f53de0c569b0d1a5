"""Test helpers shipped with decoctl, for the tests of the host and of plugin distributions: tiny random-weight ONNX
language models in both layouts and their tokenizer, an 8-bit (MatMulNBits) copy of one, EAGLE heads for them, the
tie-aware comparison behind every "greedy's tokens" test, statistical checks that a sampling controller keeps the
target's distribution, a clock that prices forwards by a cost model, and a serving engine's join rule on a fixed
schedule.

Everything is built on the fly from a seed, without torch and without downloads::

    from decoctl.testing import build_genai_model, reference_logits

    folder = build_genai_model(tmp_path / "target", seed=1, hidden_states=True)
    expected = reference_logits(folder, [0, 17, 42])  # float32[3, vocab]
    head = build_eagle_head(tmp_path / "eagle", folder, seed=2)  # an EAGLE draft head for that target

The models are written with the onnx package and sampling is checked with scipy, which decoctl itself does not
need: they come with the extra, ``pip install 'decoctl[testing]'``. The names load on first use (PEP 562).
``decoctl.testing.vlm`` builds a tiny vision-language model with transformers (``python -m decoctl.testing.vlm``),
``decoctl.testing.vlm_qwen`` a tiny dynamic-resolution one (Qwen2.5-VL: ``python -m decoctl.testing.vlm_qwen``),
``decoctl.testing.vlm_gemma3`` a tiny Gemma 3 (SigLIP, pan-and-scan: ``python -m decoctl.testing.vlm_gemma3``).
"""

try:
    import onnx  # noqa: F401  # checked here so that every submodule's import fails with the same message
except ImportError as _missing:
    raise ImportError(
        f"decoctl.testing builds its models with the onnx package, which is not installed ({_missing}): "
        "pip install 'decoctl[testing]'"
    ) from _missing

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.testing._costs import ForwardCostClock
    from decoctl.testing._distributions import (
        NO_SECOND,
        PenaliseSeen,
        PenaliseSeenPlugin,
        chi_square_p,
        exact_two_token_marginals,
        penalise_seen,
        sample_two_tokens,
        softmax,
    )
    from decoctl.testing._eagle import (
        DRAFT_IDS,
        HEAD_WEIGHTS,
        build_eagle3_head,
        build_eagle_head,
        eagle_head_model,
        write_eagle_head,
    )
    from decoctl.testing._greedy import TIE_GAP, assert_greedys_tokens, first_divergence_is_a_tie
    from decoctl.testing._join_rules import Alternating
    from decoctl.testing._models import (
        build_genai_model,
        build_optimum_model,
        reference_logits,
        reference_outputs,
        top2_gap,
    )
    from decoctl.testing._quantize import quantize_int8
    from decoctl.testing._tokenizer import (
        BOS_TOKEN,
        BOS_TOKEN_ID,
        EOS_TOKEN,
        EOS_TOKEN_ID,
        PAD_TOKEN,
        PAD_TOKEN_ID,
        SPECIAL_TOKENS,
        TRAINING_TEXT,
        build_tokenizer,
        write_tokenizer_config,
    )

# public name -> the module that defines it
_EXPORTS = {
    "ForwardCostClock": "decoctl.testing._costs",
    **dict.fromkeys(
        (
            "NO_SECOND",
            "PenaliseSeen",
            "PenaliseSeenPlugin",
            "chi_square_p",
            "exact_two_token_marginals",
            "penalise_seen",
            "sample_two_tokens",
            "softmax",
        ),
        "decoctl.testing._distributions",
    ),
    **dict.fromkeys(
        ("DRAFT_IDS", "HEAD_WEIGHTS", "build_eagle3_head", "build_eagle_head", "eagle_head_model", "write_eagle_head"),
        "decoctl.testing._eagle",
    ),
    **dict.fromkeys(("TIE_GAP", "assert_greedys_tokens", "first_divergence_is_a_tie"), "decoctl.testing._greedy"),
    "Alternating": "decoctl.testing._join_rules",
    **dict.fromkeys(
        ("build_genai_model", "build_optimum_model", "reference_logits", "reference_outputs", "top2_gap"),
        "decoctl.testing._models",
    ),
    "quantize_int8": "decoctl.testing._quantize",
    **dict.fromkeys(
        (
            "BOS_TOKEN",
            "BOS_TOKEN_ID",
            "EOS_TOKEN",
            "EOS_TOKEN_ID",
            "PAD_TOKEN",
            "PAD_TOKEN_ID",
            "SPECIAL_TOKENS",
            "TRAINING_TEXT",
            "build_tokenizer",
            "write_tokenizer_config",
        ),
        "decoctl.testing._tokenizer",
    ),
}

__all__ = [
    "BOS_TOKEN",
    "BOS_TOKEN_ID",
    "DRAFT_IDS",
    "EOS_TOKEN",
    "EOS_TOKEN_ID",
    "HEAD_WEIGHTS",
    "NO_SECOND",
    "PAD_TOKEN",
    "PAD_TOKEN_ID",
    "SPECIAL_TOKENS",
    "TIE_GAP",
    "TRAINING_TEXT",
    "Alternating",
    "ForwardCostClock",
    "PenaliseSeen",
    "PenaliseSeenPlugin",
    "assert_greedys_tokens",
    "build_eagle3_head",
    "build_eagle_head",
    "build_genai_model",
    "build_optimum_model",
    "build_tokenizer",
    "chi_square_p",
    "eagle_head_model",
    "exact_two_token_marginals",
    "first_divergence_is_a_tie",
    "penalise_seen",
    "quantize_int8",
    "reference_logits",
    "reference_outputs",
    "sample_two_tokens",
    "softmax",
    "top2_gap",
    "write_eagle_head",
    "write_tokenizer_config",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

"""enable-taps on exports by onnxruntime-genai's model builder (Skip norms, the builder's node names): the taps are
transformers' hidden_states (the residual stream entering each layer), hidden_states its final norm's output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from builder_models import PROMPT, Export

from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model.graph import enable_taps

ATOL = 1e-4


def test_enable_taps_gives_a_builder_export_transformers_hidden_states(llama: Export, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    tapped = load_model(enable_taps(llama.onnx, tmp_path / "tapped", layers=[1, 0, 1]), threads=1)
    ids = tapped.tokenizer.encode(PROMPT)
    sequence = Sequence("target", tapped)
    sequence.forward(ids)
    model = AutoModelForCausalLM.from_pretrained(llama.hf).eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    entering = out.hidden_states  # [i]: the residual stream entering layer i; [-1]: after the final norm
    want = np.concatenate([entering[i][0].numpy() for i in (1, 0, 1)], axis=-1)
    np.testing.assert_allclose(sequence.hidden_states("aux"), want, atol=ATOL)
    np.testing.assert_allclose(sequence.hidden_states(), entering[-1][0].numpy(), atol=ATOL)
    np.testing.assert_allclose(sequence.logits(), out.logits[0].numpy(), atol=ATOL)

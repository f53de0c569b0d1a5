"""Split prefill/decode exports (NPU-style): a prefill graph that takes a fixed number of tokens a run, beside the
decode graph, both reading and writing the same KV cache.

The prefill graph's GroupQueryAttention nodes take ``query_seqlens``: a chunk is right-padded to the graph's fixed
length, only its first ``query_seqlens`` tokens enter the cache, and their rows equal those of an unpadded forward
(onnxruntime's "Right-padded query chunks"). decoctl runs every forward of more than one token (a prompt chunk, a
speculative verification) through it, chunk by chunk, and every one-token step through the decode graph; rewinds,
forks and batched steps are the decode graph's KV cache's, unchanged.
"""

from __future__ import annotations

import attrs
import onnxruntime as ort

from decoctl.errors import ModelLoadError
from decoctl.model._spec import ModelSpec

__all__ = ["QUERY_SEQLENS", "PrefillGraph", "read_prefill"]

#: the prefill graph's input that takes how many of a padded chunk's tokens are real
QUERY_SEQLENS = "query_seqlens"


@attrs.frozen(kw_only=True)
class PrefillGraph:
    """The prefill session, its fixed chunk length and the names it binds (its mask: ``attention_mask``)."""

    session: ort.InferenceSession
    chunk: int
    file: str


def read_prefill(
    spec: ModelSpec, session: ort.InferenceSession, decoder: ort.InferenceSession, file: str
) -> PrefillGraph:
    """Check a prefill graph against the decode graph (the same KV inputs and outputs, names and types; a fixed chunk
    length; a query_seqlens input) and describe it. ModelLoadError names the file and the fix."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    dec_inputs = {i.name: i for i in decoder.get_inputs()}
    dec_outputs = {o.name: o for o in decoder.get_outputs()}
    if QUERY_SEQLENS not in inputs:
        raise ModelLoadError(
            f"{file}: a prefill graph takes {QUERY_SEQLENS} (how many of a padded chunk's tokens are real) and feeds "
            "it to every GroupQueryAttention node; export it with that input"
        )
    ids = inputs.get(spec.input_ids_name)
    chunk = ids.shape[1] if ids is not None and len(ids.shape) == 2 else None
    if not isinstance(chunk, int) or chunk < 1:
        raise ModelLoadError(
            f"{file}: {spec.input_ids_name} has no fixed chunk length ({None if ids is None else ids.shape}); a "
            "prefill graph takes [1, CHUNK] tokens: export it with a fixed sequence length"
        )
    for layer in range(spec.num_layers):
        for names, mine, theirs in (
            (spec.past_names(layer), inputs, dec_inputs),
            (spec.present_names(layer), outputs, dec_outputs),
        ):
            for name in names:
                if name not in mine:
                    raise ModelLoadError(
                        f"{file}: the prefill graph lacks {name}, which the decode graph has: both read and write one "
                        "KV cache, so they take the same past and present tensors; export them together"
                    )
                if mine[name].type != theirs[name].type:
                    raise ModelLoadError(
                        f"{file}: {name} is {mine[name].type} in the prefill graph but {theirs[name].type} in the "
                        "decode graph: both must keep the KV cache in one type"
                    )
    if spec.logits_name not in outputs or spec.attention_mask_name not in inputs:
        raise ModelLoadError(
            f"{file}: a prefill graph gives {spec.logits_name} for every position and takes {spec.attention_mask_name}"
        )
    return PrefillGraph(session=session, chunk=chunk, file=file)

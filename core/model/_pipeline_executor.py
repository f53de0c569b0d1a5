"""The once-per-input part of a pipeline description, executed as described: its ``generation``-phase sessions run in
dataflow order for each input (an image, an audio window), every edge between them carrying its tensor, the last
one's output going to the session of a later phase that reads it.

A vision-language folder whose vision encoder and projector are separate graphs (or any other chain of
once-per-input sessions: a tower, a pooler, a projector) thus runs from its pipeline.json alone::

    {"sessions": {
        "vision":    {"file": "vision_tower.onnx", "phase": "generation", "host_inputs": ["pixel_values"]},
        "projector": {"file": "projector.onnx", "phase": "generation"},
        "embedding": {"file": "embedding.onnx", "phase": "chunk", "host_inputs": ["input_ids"]},
        "decoder":   {"file": "model.onnx", "phase": "step", "host_inputs": ["*"]}},
     "edges": [
        {"from": "vision.last_hidden_state", "to": "projector.hidden"},
        {"from": "projector.image_features", "to": "embedding.image_features"},
        {"from": "embedding.inputs_embeds", "to": "decoder.inputs_embeds"}]}

:class:`OncePerInput` answers ``run(outputs, feeds)`` as an onnxruntime session does, so the vision-language runner
(decoctl.model._vision) runs the chain where it ran one vision graph. :func:`check_phases` refuses, at load, an edge
that feeds a session of an earlier phase from one of a later phase (a once-per-input session cannot wait for a
per-step output, and a rewind would leave it stale), naming the edge and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from decoctl.errors import ModelLoadError
from decoctl.model._pipeline import PHASES, Pipeline

__all__ = ["OncePerInput", "check_phases", "generation_stages"]


def check_phases(pipeline: Pipeline) -> None:
    """Every edge runs forward in phase order (generation -> chunk -> step, or within one phase); ModelLoadError
    naming the edge otherwise."""
    rank = {name: PHASES.index(pipeline.stage(name).phase) for name in pipeline.names}
    for edge in pipeline.edges:
        (source, _), (target, _) = edge.ends()
        if rank[source] > rank[target]:
            raise ModelLoadError(
                f"{pipeline.origin}: edge {edge.source} -> {edge.target} feeds a {pipeline.stage(target).phase}-phase "
                f"session from a {pipeline.stage(source).phase}-phase one: {target!r} runs before {source!r} gives "
                f"that output (and a rewind would leave it stale); make {target!r} run in phase "
                f"{pipeline.stage(source).phase!r} or later, or feed it from the host"
            )


def generation_stages(pipeline: Pipeline) -> tuple[str, ...]:
    """The generation-phase sessions in dataflow order (each after every session that feeds it)."""
    names = [s.name for s in pipeline.stages if s.phase == "generation"]
    feeds = {name: {e.ends()[0][0] for e in pipeline.edges if e.ends()[1][0] == name} for name in names}
    ordered: list[str] = []
    while len(ordered) < len(names):  # the pipeline has no cycle (Pipeline.validate checked)
        ordered += [n for n in names if n not in ordered and feeds[n] & set(names) <= set(ordered)]
    return tuple(ordered)


class OncePerInput:
    """The generation-phase sessions of ``pipeline`` (opened: ``sessions``), run in dataflow order per input.
    ``runs`` counts the chain's runs (one per input); ``stage_runs`` each session's."""

    def __init__(self, pipeline: Pipeline, sessions: Mapping[str, Any]) -> None:
        self.order = generation_stages(pipeline)
        self.origin = pipeline.origin
        self._sessions = {name: sessions[name] for name in self.order}
        inside = set(self.order)
        #: (session, input) -> (session, output) for the edges inside the chain
        self._edges = {
            e.ends()[1]: e.ends()[0] for e in pipeline.edges if e.ends()[0][0] in inside and e.ends()[1][0] in inside
        }
        #: each session's outputs that another session of the chain reads
        self._kept = {name: [port for (source, port) in self._edges.values() if source == name] for name in self.order}
        self._inputs = {name: [i.name for i in sessions[name].get_inputs()] for name in self.order}
        self.host_inputs = tuple(
            dict.fromkeys(port for name in self.order for port in self._inputs[name] if (name, port) not in self._edges)
        )
        self.runs = 0
        self.stage_runs = dict.fromkeys(self.order, 0)

    @property
    def last(self) -> str:
        """The session whose outputs leave the chain."""
        return self.order[-1]

    def get_inputs(self) -> list[Any]:
        """The inputs the host feeds (the first session's, and any other no edge feeds), as onnxruntime lists them."""
        found = []
        for name in self.order:
            found += [i for i in self._sessions[name].get_inputs() if (name, i.name) not in self._edges]
        return found

    def get_outputs(self) -> list[Any]:
        return list(self._sessions[self.last].get_outputs())

    def run(self, output_names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run every session once, in order, each edge carrying its tensor; the last session's ``output_names``."""
        missing = [name for name in self.host_inputs if name not in feeds]
        if missing:
            raise ModelLoadError(f"{self.origin}: the once-per-input sessions need the inputs {missing} from the host")
        values: dict[tuple[str, str], np.ndarray] = {}
        for name in self.order:
            inputs = {
                port: values[self._edges[(name, port)]] if (name, port) in self._edges else feeds[port]
                for port in self._inputs[name]
            }
            wanted = list(dict.fromkeys([*self._kept[name], *(output_names if name == self.last else ())]))
            for port, value in zip(wanted, self._sessions[name].run(wanted, inputs), strict=True):
                values[(name, port)] = value
            self.stage_runs[name] += 1
        self.runs += 1
        return [values[(self.last, port)] for port in output_names]

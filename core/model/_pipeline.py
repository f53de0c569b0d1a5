"""A composite model as one description: which graphs (sessions) exist, in which phase each runs, and which output
feeds which input; validated whole at load, before any session runs.

Phases: ``generation`` (once per generation, or per image: a vision encoder, a text encoder), ``chunk`` (once per
prompt chunk and per forward: an embedding stage), ``step`` (the decoder: every forward). An edge is
``"session.output" -> "session.input"``. The host feeds the decoder's own inputs (token ids or embeddings, lengths,
the KV cache, tree inputs) and the ``generation`` sessions' inputs (pixel values, source ids); every other input of
every session must be fed by exactly one edge.

Where the description comes from: a folder's ``pipeline.json`` (decoctl's schema, docs/ARCHITECTURE.md), else
onnxruntime-genai's ``vision`` / ``embedding`` / ``decoder`` sections of genai_config.json; a plain decoder-only or
encoder-decoder folder is one of the presets (:func:`decoder_only`, :func:`encoder_decoder`; a split export's
pipeline.json is :func:`split_prefill`'s). Every one is lowered to what runs by decoctl.model._lowering, and
``decoctl models pipeline MODEL`` prints the one a folder runs (:func:`to_json`).

Validation names the file, the edge and the fix for: an unknown session, a port the graph lacks (with the ports it
has), an edge whose output belongs to another session than the one named, an input fed twice or not at all, a
cycle, and an output whose element type or fixed sizes differ from the input it feeds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from decoctl.errors import ModelLoadError

__all__ = [
    "PHASES",
    "Edge",
    "Pipeline",
    "Port",
    "Stage",
    "decoder_only",
    "encoder_decoder",
    "read_pipeline",
    "split_prefill",
    "to_json",
]

PHASES = ("generation", "chunk", "step")
PIPELINE_FILE = "pipeline.json"
#: what a preset's edge fault asks for: its edges are the layout's own, so its graphs are what disagree
PRESET_FIX = (
    "the graphs do not belong together (files of another export?): copy the files of one export, or describe the "
    "folder in a pipeline.json (decoctl models pipeline MODEL prints the preset to start from)"
)


@attrs.frozen(kw_only=True)
class Port:
    """One input or output of a graph: its element type ("tensor(float)") and shape (ints, names or None)."""

    name: str
    type: str
    shape: tuple[int | str | None, ...]


@attrs.frozen(kw_only=True)
class Stage:
    """One session: a graph file, the phase it runs in, and the inputs the host feeds it itself. ``shares_kv``:
    it reads and writes the decoder's KV cache (a prefill graph beside a decode graph)."""

    name: str
    file: str
    phase: str = attrs.field(validator=attrs.validators.in_(PHASES))
    host_inputs: tuple[str, ...] = ()
    shares_kv: bool = False


@attrs.frozen(kw_only=True)
class Edge:
    """``source`` ("session.output") feeds ``target`` ("session.input")."""

    source: str
    target: str

    def ends(self) -> tuple[tuple[str, str], tuple[str, str]]:
        return _split(self.source), _split(self.target)


def _split(endpoint: str) -> tuple[str, str]:
    session, dot, port = endpoint.partition(".")
    return (session, port) if dot else (session, "")


@attrs.frozen(kw_only=True)
class Pipeline:
    """Sessions and the dataflow between them; ``origin``: the file it was read from (named in every error)."""

    stages: tuple[Stage, ...]
    edges: tuple[Edge, ...]
    origin: str
    #: what an edge's fault asks for: the edge fixed where a file describes it; a preset's edges are the layout's,
    #: so there the graphs are what disagree
    fix: str = "fix the edge"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def validate(self, ports: Mapping[str, tuple[tuple[Port, ...], tuple[Port, ...]]]) -> None:
        """Check the description against each session's (inputs, outputs), read from its graph; raise
        ModelLoadError naming the file, the edge and the fix for the first fault."""
        names = set(self.names)
        for edge in self.edges:  # first every endpoint: the sessions and ports named exist
            self._check_ends(edge, names, ports)
        cycle = self._cycle()
        if cycle:
            raise ModelLoadError(
                f"{self.origin}: the sessions feed each other in a cycle ({' -> '.join(cycle)}): a session's outputs "
                "may only feed sessions that run after it; remove one of those edges"
            )
        fed: dict[tuple[str, str], Edge] = {}
        for edge in self.edges:
            (source, output), (target, input_) = edge.ends()
            if (target, input_) in fed:
                raise self._error(edge, f"{target}.{input_} is already fed by {fed[(target, input_)].source}")
            if input_ in self.stage(target).host_inputs:
                raise self._error(edge, f"{target}.{input_} is fed by the host; an edge cannot feed it too")
            fed[(target, input_)] = edge
            outputs = {p.name: p for p in ports[source][1]}
            inputs = {p.name: p for p in ports[target][0]}
            _check_match(self, edge, outputs[output], inputs[input_])
        sources = {e.ends()[0][0] for e in self.edges}
        for stage in self.stages:
            if stage.phase != "step" and not stage.shares_kv and stage.name not in sources:
                raise ModelLoadError(
                    f"{self.origin}: session {stage.name!r} feeds nothing (no edge leaves it): connect its output to "
                    "the session that reads it, or remove the session"
                )
            if "*" in stage.host_inputs:
                continue  # the host feeds every input no edge feeds (the decoder's own)
            for port in ports[stage.name][0]:
                if port.name not in stage.host_inputs and (stage.name, port.name) not in fed:
                    raise ModelLoadError(
                        f"{self.origin}: input {stage.name}.{port.name} is fed by no edge and not by the host: add an "
                        f'edge "<session>.<output>" -> "{stage.name}.{port.name}", or check its spelling'
                    )

    def _check_ends(
        self, edge: Edge, names: set[str], ports: Mapping[str, tuple[tuple[Port, ...], tuple[Port, ...]]]
    ) -> None:
        (source, output), (target, input_) = edge.ends()
        for session, role in ((source, "source"), (target, "target")):
            if session not in names:
                raise self._error(edge, f"its {role} session {session!r} is not one of {sorted(names)}")
        if not output or not input_:
            raise self._error(edge, 'each end is "session.port"')
        outputs = {p.name for p in ports[source][1]}
        if output not in outputs:
            owner = [s for s in self.names if any(p.name == output for p in ports[s][1])]
            where = (
                f"it is an output of {owner[0]!r}, not of {source!r}"
                if owner
                else f"{source!r} has the outputs {sorted(outputs)}"
            )
            raise self._error(edge, f"{source!r} has no output {output!r}: {where}")
        inputs = {p.name for p in ports[target][0]}
        if input_ not in inputs:
            raise self._error(edge, f"{target!r} has no input {input_!r}: it has {sorted(inputs)}")

    def _cycle(self) -> list[str]:
        after: dict[str, set[str]] = {name: set() for name in self.names}
        for edge in self.edges:
            (source, _), (target, _) = edge.ends()
            after[source].add(target)
        state: dict[str, int] = {}
        path: list[str] = []

        def visit(node: str) -> list[str]:
            state[node] = 1
            path.append(node)
            for nxt in sorted(after[node]):
                if state.get(nxt) == 1:
                    return [*path[path.index(nxt) :], nxt]
                if nxt not in state:
                    found = visit(nxt)
                    if found:
                        return found
            state[node] = 2
            path.pop()
            return []

        for name in self.names:
            if name not in state:
                found = visit(name)
                if found:
                    return found
        return []

    def _error(self, edge: Edge, why: str) -> ModelLoadError:
        return ModelLoadError(f"{self.origin}: edge {edge.source} -> {edge.target}: {why}; {self.fix}")


def _check_match(pipeline: Pipeline, edge: Edge, output: Port, input_: Port) -> None:
    if output.type != input_.type:
        raise pipeline._error(edge, f"the output is {output.type} but the input takes {input_.type}")
    if output.shape and input_.shape and len(output.shape) != len(input_.shape):
        raise pipeline._error(edge, f"the output has rank {len(output.shape)} but the input takes {len(input_.shape)}")
    for axis, (a, b) in enumerate(zip(output.shape, input_.shape, strict=False)):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            raise pipeline._error(
                edge,
                f"axis {axis} is {a} at the output but {b} at the input ({list(output.shape)} -> {list(input_.shape)})",
            )


def decoder_only(graph: str, *, origin: str | None = None) -> Pipeline:
    """The preset of a decoder-only folder: one session, the decoder, every input the host's."""
    return Pipeline(
        stages=(Stage(name="decoder", file=graph, phase="step", host_inputs=("*",)),),
        edges=(),
        origin=origin or graph,
        fix=PRESET_FIX,
    )


def encoder_decoder(
    encoder: str,
    decoder: str,
    *,
    first: str | None = None,
    output: str = "last_hidden_state",
    hidden_input: str = "encoder_hidden_states",
    origin: str | None = None,
) -> Pipeline:
    """The preset of an encoder-decoder folder: the encoder once per input (a source text, an audio window), its
    hidden states into the decoder's cross-attention. ``first``: a separate first-pass decoder (Optimum's
    decoder_model.onnx beside decoder_with_past_model.onnx), a chunk-phase session sharing the decoder's KV that
    takes the encoder's output and writes the cross-attention KV once; None for a merged decoder, which does both."""
    reader = "first_pass" if first is not None else "decoder"
    stages = [Stage(name="encoder", file=encoder, phase="generation", host_inputs=("*",))]
    if first is not None:
        stages.append(Stage(name="first_pass", file=first, phase="chunk", host_inputs=("*",), shares_kv=True))
    stages.append(Stage(name="decoder", file=decoder, phase="step", host_inputs=("*",)))
    return Pipeline(
        stages=tuple(stages),
        edges=(Edge(source=f"encoder.{output}", target=f"{reader}.{hidden_input}"),),
        origin=origin or decoder,
        fix=PRESET_FIX,
    )


def split_prefill(prefill: str, decoder: str, *, origin: str | None = None) -> Pipeline:
    """The preset of a split prefill/decode export: a fixed-length prefill graph runs every multi-token forward
    chunk by chunk, the decode graph every one-token step, both on one KV cache."""
    return Pipeline(
        stages=(
            Stage(name="prefill", file=prefill, phase="chunk", host_inputs=("*",), shares_kv=True),
            Stage(name="decoder", file=decoder, phase="step", host_inputs=("*",)),
        ),
        edges=(),
        origin=origin or decoder,
        fix=PRESET_FIX,
    )


def to_json(pipeline: Pipeline) -> dict[str, Any]:
    """``pipeline`` in pipeline.json's format (what :func:`read_pipeline` reads back as the same description)."""
    sessions: dict[str, Any] = {}
    for stage in pipeline.stages:
        entry: dict[str, Any] = {"file": stage.file, "phase": stage.phase}
        if stage.host_inputs:
            entry["host_inputs"] = list(stage.host_inputs)
        if stage.shares_kv:
            entry["shares_kv"] = True
        sessions[stage.name] = entry
    return {"sessions": sessions, "edges": [{"from": e.source, "to": e.target} for e in pipeline.edges]}


def read_pipeline(folder: Path) -> Pipeline | None:
    """The folder's composite description: pipeline.json, else genai_config.json's vision/embedding sections;
    None for a plain folder (a preset applies)."""
    path = folder / PIPELINE_FILE
    if path.is_file():
        return _from_file(path)
    config_path = folder / "genai_config.json"
    if not config_path.is_file():
        return None
    model = json.loads(config_path.read_text(encoding="utf-8")).get("model", {})
    if "vision" not in model and "embedding" not in model:
        return None
    return _from_genai(config_path, model)


def _from_genai(path: Path, model: Mapping[str, Any]) -> Pipeline:
    """onnxruntime-genai's vision-language sections: vision (pixel_values -> image_features), embedding
    (input_ids, image_features -> inputs_embeds) and the decoder (inputs_embeds)."""
    try:
        vision, embedding, decoder = model["vision"], model["embedding"], model["decoder"]
    except KeyError as exc:
        raise ModelLoadError(
            f"{path}: a vision-language config needs the sections vision, embedding and decoder; {exc} is missing"
        ) from exc
    v_in, v_out = vision.get("inputs", {}), vision.get("outputs", {})
    e_in, e_out = embedding.get("inputs", {}), embedding.get("outputs", {})
    d_in = decoder.get("inputs", {})
    features = v_out.get("image_features", "image_features")
    stages = (
        Stage(
            name="vision",
            file=vision.get("filename", "vision.onnx"),
            phase="generation",
            # the pixel values first; a family whose vision graph takes more from the host names them too
            host_inputs=tuple(
                dict.fromkeys((v_in.get("pixel_values", "pixel_values"), *(str(name) for name in v_in.values())))
            ),
        ),
        Stage(
            name="embedding",
            file=embedding.get("filename", "embedding.onnx"),
            phase="chunk",
            host_inputs=(e_in.get("input_ids", "input_ids"),),
        ),
        Stage(name="decoder", file=decoder.get("filename", "model.onnx"), phase="step", host_inputs=("*",)),
    )
    edges = (
        Edge(source=f"vision.{features}", target=f"embedding.{e_in.get('image_features', 'image_features')}"),
        Edge(
            source=f"embedding.{e_out.get('inputs_embeds', 'inputs_embeds')}",
            target=f"decoder.{d_in.get('inputs_embeds', 'inputs_embeds')}",
        ),
    )
    return Pipeline(stages=stages, edges=edges, origin=str(path))


def _from_file(path: Path) -> Pipeline:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        stages = tuple(
            Stage(
                name=name,
                file=s["file"],
                phase=s["phase"],
                host_inputs=tuple(s.get("host_inputs", ())),
                shares_kv=bool(s.get("shares_kv", False)),
            )
            for name, s in data["sessions"].items()
        )
        edges = tuple(Edge(source=e["from"], target=e["to"]) for e in data.get("edges", ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{path}: not a pipeline description ({type(exc).__name__}: {exc}); it holds "
            '{"sessions": {NAME: {"file": ..., "phase": "generation|chunk|step", "host_inputs": [...], '
            '"shares_kv": false}}, '
            '"edges": [{"from": "session.output", "to": "session.input"}]} (docs/ARCHITECTURE.md)'
        ) from exc
    return Pipeline(stages=stages, edges=edges, origin=str(path))


def ports_of(session: Any) -> tuple[tuple[Port, ...], tuple[Port, ...]]:
    """A loaded onnxruntime session's (inputs, outputs)."""

    def port(node: Any) -> Port:
        return Port(name=node.name, type=node.type, shape=tuple(node.shape))

    return tuple(port(i) for i in session.get_inputs()), tuple(port(o) for o in session.get_outputs())

"""The one place a choice of controller, options and processors is checked, and a request becomes its controller,
logits chain and host: for the Generator (decoctl generate, streams, batched prompts) and the server's engine alike.

choice = check_choice(spec, options, processors, registry)      # ConfigError naming what is wrong
check_models(spec, choice.options, {"target": model, ...})      # vocabularies, kinds, capabilities
host, output = open_host(model, {"target": sequence}, ids, max_new_tokens=64, stop=(), seed=0, chain=choice.chain)
controller = make_controller(spec, choice.options)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs
import numpy as np

from decoctl.controllers import Controller, RowController
from decoctl.errors import CapabilityError, ConfigError, ControllerError
from decoctl.host import TREE_TRANSFORM_HINT, Host, Output, Rows, Sequence, StopRules
from decoctl.model._capabilities import FEATURES
from decoctl.model._loader import LoadedModel
from decoctl.plugins import PluginRegistry, Processors, checked_controller, parse_processor_chain
from decoctl.processing import ProcessorChain
from decoctl.specs import ControllerSpec, parse_options

__all__ = ["CAPABILITY_FIXES", "Choice", "check_choice", "check_models", "make_controller", "open_host"]

#: how a model gains each capability a controller may require
CAPABILITY_FIXES = {
    "hidden_states": "export it with onnxruntime-genai's builder option include_hidden_states=1",
    "aux_hidden_states": (
        "export it with the builder options include_hidden_states=1 and aux_hidden_state_layers, or copy it with "
        "`decoctl models enable-taps SRC DST`"
    ),
    "logits_all_positions": "re-export it with logits for every position",
    "position_ids": "re-export it with a position_ids input",
    "tree": TREE_TRANSFORM_HINT,
    "features": (
        f"give a draft head whose graph takes the target's features as its {FEATURES} input "
        "(tools/export_eagle.py writes one)"
    ),
}


@attrs.frozen(kw_only=True)
class Choice:
    """A checked choice: the controller's parsed ``options``, the logits ``chain`` built from its processors (its
    grammars compiled: build it once and clone it for each sequence) and the ``roles`` the controller uses."""

    options: Mapping[str, Any]
    chain: ProcessorChain
    roles: tuple[str, ...]


def check_choice(
    spec: ControllerSpec, options: Mapping[str, Any] | None, processors: Processors, registry: PluginRegistry
) -> Choice:
    """``options`` checked against the controller's schema and its own check, the chain built, and the pair checked
    together (a controller that draws no tokens refuses sample-only processors); ConfigError otherwise."""
    parsed = parse_options(f"controller {spec.name!r}", spec.options, options or {})
    if spec.check_options is not None:
        spec.check_options(parsed)
    chain = parse_processor_chain(processors, registry)
    sample_only = {id(p) for p in chain.sample_only}
    if sample_only and not spec.sampling_processors:
        names = ", ".join(n for p, n in zip(chain.processors, chain.names, strict=True) if id(p) in sample_only)
        raise ConfigError(
            f"controller {spec.name!r} ranks continuations by probability and draws none, but the logits "
            f"chain holds sample-only processors ({names}), which shape a distribution to draw from "
            "(transformers leaves them out of beam search, with a warning): remove them from the chain, or use "
            "a sampling controller"
        )
    return Choice(options=parsed, chain=chain, roles=tuple(spec.active_roles(parsed)))


def check_models(spec: ControllerSpec, options: Mapping[str, Any], models: Mapping[str, LoadedModel]) -> None:
    """Whether the loaded ``models`` (role -> model, "target" among them) can run the controller with ``options``:
    one vocabulary, one kind (decoder-only or encoder-decoder), and every capability it needs on each role."""
    target = models["target"]
    for role, model in models.items():
        if model.spec.vocab_size != target.spec.vocab_size:
            raise ConfigError(
                f"role {role!r} (model {model.name}, vocabulary {model.spec.vocab_size}) and role 'target' "
                f"(model {target.name}, vocabulary {target.spec.vocab_size}) have different vocabularies: "
                "every role must share the target's tokenizer"
            )
        _check_encoder_decoder(role, model, target)
        needed = spec.active_capabilities(options).get(role, ())
        # a tap the decoder gives but the model's pipeline does not carry on every forward (decoctl.model._lowering)
        gaps = [(c, model.tap_gaps[c]) for c in needed if c in model.tap_gaps]
        if gaps:
            raise CapabilityError(
                f"controller {spec.name!r} needs {gaps[0][0]} on role {role!r} (model {model.name}): {gaps[0][1]}"
            )
        lacking = [c for c in needed if c not in model.capabilities.names()]
        if lacking:
            fixes = "; ".join(CAPABILITY_FIXES.get(c, f"export the model with {c}") for c in lacking)
            raise CapabilityError(
                f"controller {spec.name!r} needs {lacking} on role {role!r}, which model {model.name} "
                f"lacks (it has {list(model.capabilities.names())}): {fixes}"
            )


def _check_encoder_decoder(role: str, model: LoadedModel, target: LoadedModel) -> None:
    """A role beside an encoder-decoder target reads the same source and continues the same decoder prompt: it must
    be an encoder-decoder model starting from the target's decoder start token (and a decoder-only target takes
    decoder-only roles)."""
    if (model.encoder is None) != (target.encoder is None):
        kind = {True: "a decoder-only model", False: "an encoder-decoder model"}
        raise ConfigError(
            f"role {role!r} (model {model.name}) is {kind[model.encoder is None]} but the target ({target.name}) is "
            f"{kind[target.encoder is None]}: every role must be the same kind, since a role reads what the target "
            "reads (an encoder-decoder draft runs its own encoder on the same source); give a "
            f"{'smaller encoder-decoder model' if target.encoder else 'decoder-only model'} for it"
        )
    if model.encoder is not None and target.encoder is not None:
        start, target_start = model.encoder.parts.decoder_start_token_id, target.encoder.parts.decoder_start_token_id
        if start != target_start:
            raise ConfigError(
                f"role {role!r} (model {model.name}) starts its decoder from token {start} but the target "
                f"({target.name}) from {target_start}: the two decoders would continue different prompts; give a "
                "model trained with the target's tokenizer and decoder_start_token_id (its config.json)"
            )


def open_host(
    model: LoadedModel,
    sequences: Mapping[str, Sequence],
    ids: np.ndarray,
    *,
    max_new_tokens: int,
    stop: tuple[str, ...],
    seed: int | None,
    chain: ProcessorChain,
    sink: Callable[[list[int], str], None] | None = None,
    scratch: int = 0,
    rows: Mapping[str, Rows] | None = None,
    prefill_chunk: int | None = None,
    source: np.ndarray | None = None,
) -> tuple[Host, Output]:
    """The host of one request and its output (its committed tokens and text), over ``sequences`` (role ->
    Sequence, "target" among them), its prompt ``ids`` (int64[n]) not yet fed: the stop rules (the row's room less
    ``scratch``, the positions a drafting controller feeds beyond what it keeps), the output (``sink`` sees each
    commit), ``chain`` reset with the prompt. With ``rows``, beams and parallel samples may start other completions;
    ``source``: an encoder-decoder target's."""
    target = sequences["target"]
    rules = StopRules(
        eos_token_ids=model.spec.eos_token_ids,
        max_new_tokens=max_new_tokens,
        stop_strings=stop,
        capacity=target.max_length - len(ids) - scratch,
    )
    detokenizer = model.tokenizer.detokenizer
    output = Output(rules, detokenizer(), sink)
    chain.reset(ids)
    host = Host(
        sequences,
        output,
        prompt=ids,
        chain=chain,
        seed=seed,
        rows=rows,
        new_output=(lambda: Output(rules, detokenizer(), None)) if rows is not None else None,
    )
    host.prefill_chunk = prefill_chunk
    if source is not None and source.dtype == np.int64:  # a speech source is features: no tokens to look up
        host.source_tokens = source
    return host, output


def make_controller(spec: ControllerSpec, options: Mapping[str, Any], *, batched: bool = False) -> Controller:
    """A new controller of ``spec`` with ``options`` (a shared library's through the ABI bridge); ``batched``: it
    must step one row among many (a RowController), else ControllerError."""
    if spec.factory is None:
        from decoctl import abi  # the compiled bridge is only needed for shared-library controllers

        controller: Controller = abi.library_factory(spec)(dict(options))
    else:
        controller = cast(Controller, checked_controller(spec.factory(dict(options)), repr(spec.name)))
    if batched and not isinstance(controller, RowController):
        raise ControllerError(
            f"controller {spec.name!r} says it is batched (ControllerSpec.batched) but has no "
            "next_token(host) method: add one, or leave batched off"
        )
    return controller

"""Tiny random-weight T5, BART and Marian models, exported in Optimum's encoder-decoder layout with torch.onnx.export.

optimum-onnx needs transformers < 4.58 (it has an environment of its own: the ``test-exports`` extra), so these
tests export in the main environment themselves, writing Optimum's file names and input/output names exactly:

- ``encoder_model.onnx``: ``input_ids``, ``attention_mask`` -> ``last_hidden_state``;
- ``decoder_model.onnx``: ``input_ids``, ``encoder_attention_mask``, ``encoder_hidden_states`` -> ``logits``,
  ``present.N.decoder.key/value``, ``present.N.encoder.key/value``;
- ``decoder_with_past_model.onnx``: those inputs plus ``past_key_values.N.decoder.key/value`` and
  ``past_key_values.N.encoder.key/value`` -> ``logits``, ``present.N.decoder.key/value``;
- ``decoder_model_merged.onnx`` (variant ``merged``): both decoders behind an If on ``use_cache_branch``, with empty
  constants for the cross-attention outputs the with-past branch lacks, as optimum's ``merge_decoders(strict=False)``
  writes it.

The folder also holds config.json and generation_config.json (transformers' save_pretrained), the tests' byte-level
tokenizer (decoctl.testing._tokenizer: BOS 0, EOS 1, PAD 2) and tokenizer_config.json. Attention is exported eager,
so that the graphs take any source and decoder length (sdpa's causal shortcut would trace the export's length in).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

from decoctl.testing._tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tokenizer, write_tokenizer_config

VOCAB = 384
#: the models share the tokenizer; their decoders start as the originals do: T5 and Marian from PAD, BART from EOS
DECODER_START = {
    "t5": PAD_TOKEN_ID,
    "bart": EOS_TOKEN_ID,
    "marian": PAD_TOKEN_ID,
    "t5-draft": PAD_TOKEN_ID,
    "bart-draft": EOS_TOKEN_ID,
}
#: seeds whose random weights greedy-decode the tests' prompts into more than one repeated token, with the top two
#: logits of every step at least 0.01 apart (random encoder-decoder models tend to repeat one token)
SEEDS = {"t5": 3, "bart": 3, "marian": 3, "t5-draft": 1, "bart-draft": 4}
CONTEXT = 128
OPSET = 17


def hf_config(name: str) -> Any:
    """The transformers config of ``name``: "t5" / "bart" / "marian" (two decoder layers, width 32) or the first
    two's "-draft" (one layer, width 16), all with the tests' vocabulary. Marian is BART's architecture with
    Marian's differences: sinusoidal positions, embeddings scaled by sqrt(width), one vocabulary shared by encoder,
    decoder and lm_head, the decoder starting from PAD, and a final_logits_bias (Seq2SeqExports.model fills it)."""
    import transformers

    draft = name.endswith("-draft")
    width, layers = (16, 1) if draft else (32, 2)
    common = {
        "vocab_size": VOCAB,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "decoder_start_token_id": DECODER_START[name],
    }
    if name == "marian":
        config = transformers.MarianConfig(
            d_model=width,
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=width // 8,
            decoder_attention_heads=width // 8,
            encoder_ffn_dim=2 * width,
            decoder_ffn_dim=2 * width,
            max_position_embeddings=CONTEXT,
            scale_embedding=True,
            share_encoder_decoder_embeddings=True,
            bos_token_id=BOS_TOKEN_ID,
            forced_eos_token_id=None,
            init_std=1.0,
            **common,
        )
    elif name.startswith("t5"):
        config = transformers.T5Config(
            d_model=width,
            d_kv=8,
            d_ff=2 * width,
            num_layers=layers,
            num_decoder_layers=layers,
            num_heads=width // 8,
            relative_attention_num_buckets=8,
            # a wider spread than T5's 1.0 (and BART's 0.02 below) keeps greedy's top two logits apart, so that a
            # token-for-token comparison tests the runtime, not rounding
            initializer_factor=8.0,
            **common,
        )
    else:
        config = transformers.BartConfig(
            d_model=width,
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=width // 8,
            decoder_attention_heads=width // 8,
            encoder_ffn_dim=2 * width,
            decoder_ffn_dim=2 * width,
            max_position_embeddings=CONTEXT,
            bos_token_id=BOS_TOKEN_ID,
            forced_eos_token_id=None,
            init_std=1.0,
            **common,
        )
    config._attn_implementation = "eager"
    return config


def _flat_cache(cache: Any, layers: int, *, cross: bool) -> list[Any]:
    """An EncoderDecoderCache as Optimum's flat list: per layer decoder key, value (and encoder key, value)."""
    flat = []
    for layer in range(layers):
        own, other = cache.self_attention_cache.layers[layer], cache.cross_attention_cache.layers[layer]
        flat += [own.keys, own.values] + ([other.keys, other.values] if cross else [])
    return flat


def _names(prefix: str, layers: int, parts: tuple[str, ...]) -> list[str]:
    return [f"{prefix}.{layer}.{part}.{kv}" for layer in range(layers) for part in parts for kv in ("key", "value")]


def export(model: Any, folder: Path) -> None:
    """Write ``model`` (a T5 or BART ForConditionalGeneration or a MarianMTModel, in eval mode) as Optimum's three
    graphs."""
    import torch
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    layers = (
        model.config.num_decoder_layers if hasattr(model.config, "num_decoder_layers") else model.config.decoder_layers
    )

    class Part(torch.nn.Module):
        """A part of ``model``, which it holds as a submodule: its weights are the graph's initializers."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

    class Encoder(Part):
        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class Decoder(Part):
        def forward(self, input_ids: Any, encoder_attention_mask: Any, encoder_hidden_states: Any) -> Any:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            out = self.model(
                encoder_outputs=(encoder_hidden_states,),
                attention_mask=encoder_attention_mask,
                decoder_input_ids=input_ids,
                past_key_values=cache,
                use_cache=True,
            )
            return (out.logits, *_flat_cache(out.past_key_values, layers, cross=True))

    class DecoderWithPast(Part):
        def forward(self, input_ids: Any, encoder_attention_mask: Any, encoder_hidden_states: Any, *past: Any) -> Any:
            cache = EncoderDecoderCache([tuple(past[4 * i : 4 * i + 4]) for i in range(layers)])
            out = self.model(
                encoder_outputs=(encoder_hidden_states,),
                attention_mask=encoder_attention_mask,
                decoder_input_ids=input_ids,
                past_key_values=cache,
                use_cache=True,
            )
            return (out.logits, *_flat_cache(out.past_key_values, layers, cross=False))

    batch, source, target = "batch_size", "encoder_sequence_length", "decoder_sequence_length"
    past_length = "past_decoder_sequence_length"
    source_ids = torch.tensor([[5, 6, 7, 8, 9, 10, EOS_TOKEN_ID]])
    mask = torch.ones_like(source_ids)
    decoder_ids = torch.tensor([[model.config.decoder_start_token_id, 7, 8]])
    step_ids = torch.tensor([[9, 4]])
    presents = _names("present", layers, ("decoder", "encoder"))
    pasts = _names("past_key_values", layers, ("decoder", "encoder"))
    step_presents = _names("present", layers, ("decoder",))
    shared = {
        "input_ids": {0: batch, 1: target},
        "encoder_attention_mask": {0: batch, 1: source},
        "encoder_hidden_states": {0: batch, 1: source},
        "logits": {0: batch, 1: target},
    }
    folder.mkdir(parents=True, exist_ok=True)
    # the tracer's warnings are about Python values it folds: every graph is checked against transformers instead
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = Encoder().eval()  # a module left in training mode would switch the model's dropout on
        hidden = encoder(source_ids, mask)
        torch.onnx.export(
            encoder,
            (source_ids, mask),
            str(folder / "encoder_model.onnx"),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={name: {0: batch, 1: source} for name in ("input_ids", "attention_mask", "last_hidden_state")},
            dynamo=False,
            opset_version=OPSET,
        )
        decoder = Decoder().eval()
        first = decoder(decoder_ids, mask, hidden)
        axes = {**shared, **{n: {0: batch, 2: source if ".encoder." in n else target} for n in presents}}
        torch.onnx.export(
            decoder,
            (decoder_ids, mask, hidden),
            str(folder / "decoder_model.onnx"),
            input_names=["input_ids", "encoder_attention_mask", "encoder_hidden_states"],
            output_names=["logits", *presents],
            dynamic_axes=axes,
            dynamo=False,
            opset_version=OPSET,
        )
        axes = {
            **shared,
            **{n: {0: batch, 2: source if ".encoder." in n else past_length} for n in pasts},
            **{n: {0: batch, 2: f"{past_length} + {target}"} for n in step_presents},
        }
        torch.onnx.export(
            DecoderWithPast().eval(),
            (step_ids, mask, hidden, *first[1:]),
            str(folder / "decoder_with_past_model.onnx"),
            input_names=["input_ids", "encoder_attention_mask", "encoder_hidden_states", *pasts],
            output_names=["logits", *step_presents],
            dynamic_axes=axes,
            dynamo=False,
            opset_version=OPSET,
        )
    model.eval()


def merge(folder: Path) -> None:
    """Write ``decoder_model_merged.onnx`` from the folder's two decoders as optimum's ``merge_decoders(strict=False)``
    does: an If on ``use_cache_branch`` (else: the first-pass decoder; then: the with-past one, which gets an empty
    constant for each cross-attention output it lacks), the inputs of both."""
    import onnx
    from onnx import helper

    first = onnx.load(str(folder / "decoder_model.onnx"))
    with_past = onnx.load(str(folder / "decoder_with_past_model.onnx"))
    # the with-past branch's values get their own names: the two traces name their values alike
    renamed = {}
    for node in with_past.graph.node:
        for index, name in enumerate(node.output):
            if name not in {o.name for o in with_past.graph.output}:
                renamed[name] = f"with_past/{name}"
                node.output[index] = renamed[name]
    for initializer in with_past.graph.initializer:
        renamed[initializer.name] = f"with_past/{initializer.name}"
        initializer.name = renamed[initializer.name]
    for node in with_past.graph.node:
        for index, name in enumerate(node.input):
            node.input[index] = renamed.get(name, name)
    have = {o.name for o in with_past.graph.output}
    for output in first.graph.output:
        if output.name not in have:
            dims = [d.dim_value if d.dim_value else None for d in output.type.tensor_type.shape.dim]
            shape = [0 if i == 0 else 1 if d is None else d for i, d in enumerate(dims)]
            empty = helper.make_tensor("empty", output.type.tensor_type.elem_type, shape, [])
            with_past.graph.node.append(helper.make_node("Constant", [], [output.name], value=empty))
    by_name = {o.name: o for o in with_past.graph.output}
    outputs = [by_name.get(o.name, o) for o in first.graph.output]
    then_branch = helper.make_graph(
        list(with_past.graph.node), "with_past", [], outputs, initializer=list(with_past.graph.initializer)
    )
    else_branch = helper.make_graph(
        list(first.graph.node), "no_past", [], list(first.graph.output), initializer=list(first.graph.initializer)
    )
    branch = helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    node = helper.make_node(
        "If",
        ["use_cache_branch"],
        [o.name for o in first.graph.output],
        then_branch=then_branch,
        else_branch=else_branch,
    )
    inputs = {i.name: i for i in [*first.graph.input, *with_past.graph.input]}
    graph = helper.make_graph([node], "merged", [*inputs.values(), branch], list(first.graph.output))
    merged = helper.make_model(graph, opset_imports=list(first.opset_import))
    merged.ir_version = first.ir_version
    onnx.save(merged, str(folder / "decoder_model_merged.onnx"))


class Seq2SeqExports:
    """The session's exports, each made once on first use, under ``root``. ``model(name)`` is the transformers model
    (the oracle), ``folder(name, variant)`` its export: variant "pair" (decoder_model.onnx and
    decoder_with_past_model.onnx) or "merged" (decoder_model_merged.onnx alone)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[str, Any] = {}
        self._folders: dict[tuple[str, str], Path] = {}

    def model(self, name: str) -> Any:
        if name not in self._models:
            import torch
            import transformers

            torch.manual_seed(SEEDS[name])
            config = hf_config(name)
            if name == "marian":
                model = transformers.MarianMTModel(config).eval()
                # a buffer transformers initialises to zeros: random, so that a runtime that dropped it would differ
                model.final_logits_bias.normal_(0.0, 1.0)
            elif name.startswith("t5"):
                model = transformers.T5ForConditionalGeneration(config).eval()
            else:
                model = transformers.BartForConditionalGeneration(config).eval()
            self._models[name] = model
        return self._models[name]

    def greedy(self, name: str, ids: list[int], max_new_tokens: int, **generate: Any) -> list[int]:
        """transformers' generate() over the source ``ids`` without sampling (greedy, or beam search with
        ``num_beams``; ``generate`` goes to it): the new tokens (the decoder start token left out)."""
        import torch

        torch.set_num_threads(1)  # a tiny model's generate() takes seconds on several contending threads
        with torch.no_grad():
            out = self.model(name).generate(
                input_ids=torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                **generate,
            )
        return [int(t) for t in out[0, 1:]]

    def folder(self, name: str, variant: str = "pair") -> Path:
        key = (name, variant)
        if key not in self._folders:
            folder = self.root / variant / name  # the folder's name is the model's name in messages
            if variant == "pair":
                model = self.model(name)
                export(model, folder)
                model.config.save_pretrained(folder)
                model.generation_config.save_pretrained(folder)
                build_tokenizer(folder, vocab_size=VOCAB)
                write_tokenizer_config(folder, model_max_length=CONTEXT)
            elif variant == "merged":
                shutil.copytree(self.folder(name, "pair"), folder)
                merge(folder)
                (folder / "decoder_model.onnx").unlink()
                (folder / "decoder_with_past_model.onnx").unlink()
            else:
                raise ValueError(f"no variant {variant!r}")
            self._folders[key] = folder
        return self._folders[key]

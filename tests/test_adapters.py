"""LoRA adapters (decoctl.model._adapters): a base model with LoRA slots, adapters in onnxruntime's adapter format
chosen per generation, bound into the runner's IOBinding. Every output is checked against a merged-weights twin:
the same graph with ``W + A @ B`` in place of ``W``."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from decoctl import Generator  # noqa: E402
from decoctl.cli import main  # noqa: E402
from decoctl.errors import ConfigError, ModelLoadError  # noqa: E402
from decoctl.generation import BatchPrompt  # noqa: E402
from decoctl.model._adapters import read_adapter, with_adapters, write_adapter  # noqa: E402
from decoctl.model._loader import load_model  # noqa: E402
from decoctl.plugins import PluginRegistry  # noqa: E402
from decoctl.testing import build_genai_model  # noqa: E402

PROMPT = "def f(x):"
RANK = 4


def _lora_targets(graph: object) -> list[object]:
    """The MatMuls on a 2-D weight, but the LM head: the attention and MLP projections."""
    weights = {i.name: i for i in graph.initializer}
    return [
        n
        for n in graph.node
        if n.op_type == "MatMul"
        and n.input[1] in weights
        and len(weights[n.input[1]].dims) == 2
        and "lm_head" not in n.name
    ]


def _topological(graph: object) -> None:
    nodes = list(graph.node)
    del graph.node[:]
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    while nodes:
        waiting = []
        for node in nodes:
            if all(not name or name in ready for name in node.input):
                graph.node.append(node)
                ready.update(node.output)
            else:
                waiting.append(node)
        assert len(waiting) < len(nodes)
        nodes = waiting


def with_lora_slots(base: Path, out: Path) -> dict[str, tuple[int, int]]:
    """``base`` copied to ``out`` with a LoRA slot on every projection (zeros: the base model); slot -> (in, out)."""
    shutil.copytree(base, out)
    model = onnx.load(str(out / "model.onnx"))
    graph = model.graph
    weights = {i.name: i for i in graph.initializer}
    slots = {}
    for node in _lora_targets(graph):
        fan_in, fan_out = weights[node.input[1]].dims
        a, b = f"{node.name}.lora_A", f"{node.name}.lora_B"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.zeros((fan_in, 1), np.float32), a),
                numpy_helper.from_array(np.zeros((1, fan_out), np.float32), b),
            ]
        )
        graph.input.extend(
            [
                helper.make_tensor_value_info(a, TensorProto.FLOAT, [fan_in, "lora_rank"]),
                helper.make_tensor_value_info(b, TensorProto.FLOAT, ["lora_rank", fan_out]),
            ]
        )
        result, plain = node.output[0], node.output[0] + "/base"
        node.output[0] = plain
        graph.node.extend(
            [
                helper.make_node("MatMul", [node.input[0], a], [result + "/xa"]),
                helper.make_node("MatMul", [result + "/xa", b], [result + "/xab"]),
                helper.make_node("Add", [plain, result + "/xab"], [result]),
            ]
        )
        slots[a], slots[b] = (fan_in, RANK), (RANK, fan_out)
    _topological(graph)
    onnx.save(model, str(out / "model.onnx"))
    return slots


def merged_twin(base: Path, out: Path, parameters: dict[str, np.ndarray]) -> Path:
    """``base`` with each adapted weight replaced by W + A @ B."""
    shutil.copytree(base, out)
    model = onnx.load(str(out / "model.onnx"))
    weights = {i.name: i for i in model.graph.initializer}
    for node in _lora_targets(model.graph):
        a, b = parameters[f"{node.name}.lora_A"], parameters[f"{node.name}.lora_B"]
        merged = numpy_helper.to_array(weights[node.input[1]]) + a @ b
        weights[node.input[1]].CopyFrom(numpy_helper.from_array(merged.astype(np.float32), node.input[1]))
    onnx.save(model, str(out / "model.onnx"))
    return out


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny base model (tree inputs, so that lookahead runs) with LoRA slots, two adapters (random, rank 4) and
    each adapter's merged twin."""
    root = tmp_path_factory.mktemp("lora")
    base = build_genai_model(root / "plain", seed=3, tree_inputs=True)
    slots = with_lora_slots(base, root / "base")
    made = {"base": root / "base", "plain": base}
    for seed, name, rank in ((1, "alpha", RANK), (2, "beta", RANK), (5, "gamma", 2)):
        rng = np.random.default_rng(seed)
        parameters = {k: rng.normal(0, 0.3, _ranked(shape, rank)).astype(np.float32) for k, shape in slots.items()}
        made[name] = write_adapter(root / f"{name}.onnx_adapter", parameters)
        made[f"{name}-merged"] = merged_twin(base, root / f"{name}-merged", parameters)
    return made


def _ranked(shape: tuple[int, int], rank: int) -> tuple[int, int]:
    """A slot's shape (RANK on its rank axis) at ``rank``."""
    return (shape[0], rank) if shape[1] == RANK else (rank, shape[1])


def _tokens(generator: Generator, **kwargs: object) -> tuple[int, ...]:
    return generator.generate(PROMPT, max_new_tokens=16, **kwargs).tokens


def test_greedy_with_an_adapter_equals_its_merged_weights_twin(lora: dict[str, Path], registry: PluginRegistry) -> None:
    adapters = {"alpha": lora["alpha"], "beta": lora["beta"]}
    generator = Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters=adapters)
    for name in ("alpha", "beta"):
        twin = Generator({"target": str(lora[f"{name}-merged"])}, "greedy", threads=1, registry=registry)
        assert _tokens(generator, adapter=name) == _tokens(twin)


def test_without_an_adapter_the_slots_add_nothing(lora: dict[str, Path], registry: PluginRegistry) -> None:
    generator = Generator(
        {"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters={"alpha": lora["alpha"]}
    )
    plain = Generator({"target": str(lora["plain"])}, "greedy", threads=1, registry=registry)
    assert _tokens(generator) == _tokens(plain)


def test_switching_adapters_between_generations_leaves_no_state_behind(
    lora: dict[str, Path], registry: PluginRegistry
) -> None:
    adapters = {"alpha": lora["alpha"], "beta": lora["beta"]}
    generator = Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters=adapters)
    fresh = {
        name: _tokens(
            Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters=adapters),
            adapter=name,
        )
        for name in ("alpha", "beta")
    }
    base = _tokens(Generator({"target": str(lora["plain"])}, "greedy", threads=1, registry=registry))
    assert len({fresh["alpha"], fresh["beta"], base}) == 3  # the adapters change the answer
    for name in ("alpha", None, "beta", "alpha", None):
        assert _tokens(generator, adapter=name) == (fresh[name] if name else base)


def test_an_adapter_for_another_base_model_is_refused_at_load_naming_its_parameters(
    lora: dict[str, Path], registry: PluginRegistry, tmp_path: Path
) -> None:
    other = write_adapter(
        tmp_path / "other.onnx_adapter", {"/model/layers.9/mlp/up_proj/MatMul.lora_A": np.zeros((64, 4), np.float32)}
    )
    with pytest.raises(
        ModelLoadError, match=r"no slot for, \['/model/layers\.9/mlp/up_proj/MatMul\.lora_A'\].*another base model"
    ):
        Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters={"other": other})


def test_an_adapter_whose_shapes_do_not_fit_is_refused_at_load(
    lora: dict[str, Path], registry: PluginRegistry, tmp_path: Path
) -> None:
    name = "/model/layers.0/attn/q_proj.lora_A"
    assert name in read_adapter(lora["alpha"]).parameters
    wrong = write_adapter(tmp_path / "wrong.onnx_adapter", {name: np.zeros((3, 4), np.float32)})
    with pytest.raises(ModelLoadError, match=r"float32\[3, 4\] but model base takes float32\[64, 'lora_rank'\]"):
        Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters={"wrong": wrong})


def test_an_adapter_on_a_model_without_slots_is_refused(lora: dict[str, Path], registry: PluginRegistry) -> None:
    with pytest.raises(ModelLoadError, match="has no LoRA slots"):
        Generator({"target": str(lora["plain"])}, "greedy", threads=1, registry=registry, adapters={"a": lora["alpha"]})


def test_a_generation_naming_an_adapter_not_loaded_is_refused(lora: dict[str, Path], registry: PluginRegistry) -> None:
    generator = Generator(
        {"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters={"alpha": lora["alpha"]}
    )
    with pytest.raises(ConfigError, match=r"adapter 'gamma' is not loaded \(loaded: \['alpha'\]\)"):
        generator.generate(PROMPT, adapter="gamma")


def test_generate_takes_an_adapter_on_the_command_line(
    lora: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["generate", PROMPT, "-n", "16", "--threads", "1", "--stats", "none", "--no-stream"]
    assert main([*args, "--model", str(lora["alpha-merged"])]) == 0
    merged = capsys.readouterr().out
    assert main([*args, "--model", str(lora["base"]), "--adapter", f"alpha={lora['alpha']}"]) == 0
    assert capsys.readouterr().out == merged


@pytest.mark.parametrize(
    ("controller", "options"),
    [("speculative", {"drafter": "prompt-lookup"}), ("speculative", {}), ("lookahead", {})],
    ids=["prompt-lookup", "draft-model", "lookahead"],
)
def test_drafting_controllers_with_an_adapter_commit_what_greedy_on_its_twin_commits(
    lora: dict[str, Path], controller: str, options: dict[str, str]
) -> None:
    registry = PluginRegistry()
    if controller not in registry.controllers():
        pytest.skip(f"the {controller} plugin is not installed here")
    roles = {"target": str(lora["base"])}
    if controller == "speculative" and not options:
        roles["draft"] = str(lora["plain"])  # the draft runs as it is; the target carries the adapter
    generator = Generator(
        roles, controller, options=options, threads=1, registry=registry, adapters={"alpha": lora["alpha"]}
    )
    twin = Generator({"target": str(lora["alpha-merged"])}, "greedy", threads=1, registry=registry)
    assert _tokens(generator, adapter="alpha") == _tokens(twin)


ADAPTERS = ("alpha", "beta", "gamma")


def _loaded(lora: dict[str, Path]) -> dict[str, Path]:
    return {name: lora[name] for name in ADAPTERS}


def test_an_adapter_of_a_smaller_rank_is_zero_padded_and_equals_its_twin(
    lora: dict[str, Path], registry: PluginRegistry
) -> None:
    generator = Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters=_loaded(lora))
    twin = Generator({"target": str(lora["gamma-merged"])}, "greedy", threads=1, registry=registry)
    assert generator.models["target"].adapters.stacks["/model/layers.0/attn/q_proj.lora_A"].shape == (4, 64, RANK)
    assert _tokens(generator, adapter="gamma") == _tokens(twin)


def test_rows_of_different_adapters_in_one_batch_equal_each_alone(
    lora: dict[str, Path], registry: PluginRegistry
) -> None:
    generator = Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters=_loaded(lora))
    prompts = ["def f(x):", "import os", "class A:", "x = [1,"]
    names = [None, "alpha", "beta", "gamma", "alpha", None, "gamma", "beta"]
    batch = [BatchPrompt(prompt=prompts[i % 4], adapter=name, max_new_tokens=12) for i, name in enumerate(names)]
    results = generator.generate_batch(batch, batch_size=4)
    assert all("in one buffer" in r.stats.trace["batched"] for r in results)  # stepped together, one Run a step
    alone = [generator.generate(b.prompt, adapter=b.adapter, max_new_tokens=12).tokens for b in batch]
    assert [r.tokens for r in results] == alone
    for b, result in zip(batch, results, strict=True):
        folder = lora["plain"] if b.adapter is None else lora[f"{b.adapter}-merged"]
        twin = Generator({"target": str(folder)}, "greedy", threads=1, registry=registry)
        assert result.tokens == twin.generate(b.prompt, max_new_tokens=12).tokens


def test_beam_search_with_an_adapter_equals_beam_search_on_its_twin(
    lora: dict[str, Path], registry: PluginRegistry
) -> None:
    options = {"num_beams": 3}
    generator = Generator(
        {"target": str(lora["base"])}, "beam", options=options, threads=1, registry=registry, adapters=_loaded(lora)
    )
    twin = Generator({"target": str(lora["beta-merged"])}, "beam", options=options, threads=1, registry=registry)
    assert _tokens(generator, adapter="beta") == _tokens(twin)


def test_an_unknown_adapter_in_a_batch_is_refused_naming_the_prompt(
    lora: dict[str, Path], registry: PluginRegistry
) -> None:
    generator = Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters=_loaded(lora))
    with pytest.raises(
        ConfigError, match=r"prompt 1: adapter 'delta' is not loaded \(loaded: \['alpha', 'beta', 'gamma'\]\)"
    ):
        generator.generate_batch([PROMPT, {"prompt": PROMPT, "adapter": "delta"}])


def test_the_prefix_cache_keys_its_blocks_by_adapter(lora: dict[str, Path], registry: PluginRegistry) -> None:
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    adapters = _loaded(lora)
    cached = Generator(
        {"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters=adapters, prefix_cache_mb=4
    )
    fresh = Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry, adapters=adapters)
    order = ["alpha", "beta", None, "alpha", "beta", None]
    got = [cached.generate(prompt, adapter=name, max_new_tokens=8).tokens for name in order]
    assert got == [fresh.generate(prompt, adapter=name, max_new_tokens=8).tokens for name in order]
    assert cached.prefix_cache is not None
    stats = cached.prefix_cache.stats()
    assert (stats.lookups, stats.hits) == (6, 3)  # each adapter's second turn only: no block crosses adapters


def test_a_model_without_adapters_is_not_rewritten(lora: dict[str, Path], registry: PluginRegistry) -> None:
    generator = Generator({"target": str(lora["base"])}, "greedy", threads=1, registry=registry)
    names = {i.name for i in generator.models["target"].session.get_inputs()}
    assert generator.models["target"].adapters is None and "lora_index" not in names


def test_a_slot_that_reads_rows_flattened_into_tokens_is_refused_by_name(lora: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "flat"
    shutil.copytree(lora["base"], folder)
    model = onnx.load(str(folder / "model.onnx"))
    graph = model.graph
    first = next(n for n in graph.node if n.op_type == "MatMul" and n.input[1].endswith("q_proj.lora_A"))
    flat = first.input[0] + "/flat"
    graph.initializer.append(numpy_helper.from_array(np.array([-1, 64], np.int64), "flat_shape"))
    graph.node.insert(
        list(graph.node).index(first), helper.make_node("Reshape", [first.input[0], "flat_shape"], [flat])
    )
    first.input[0] = flat
    onnx.save(model, str(folder / "model.onnx"))
    with pytest.raises(ModelLoadError, match=r"q_proj\.lora_A reads .*flattened into tokens \(rank 2\)"):
        load_model(folder, lora_stacks=True)


def test_with_adapters_refuses_a_model_loaded_as_exported(lora: dict[str, Path]) -> None:
    with pytest.raises(ModelLoadError, match="lora_stacks=True"):
        with_adapters(load_model(lora["base"]), {"alpha": lora["alpha"]})


def test_stacking_follows_the_ranks_through_constants_splits_and_quantized_projections() -> None:
    """Gemma 3's int8 export: the embedding scaled by a Constant, a MatMulNBits projection, a packed output Split and
    Reshaped by Constant shapes (q_norm) before the slot: the walk tells [batch, sequence, in] through all of them."""
    from decoctl.model.graph._lora_stacks import rewrite

    def constant(name: str, value: np.ndarray) -> object:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))

    nodes = [
        constant("scale", np.array(2.0, np.float32)),
        helper.make_node("Mul", ["x", "scale"], ["scaled"]),
        helper.make_node(
            "MatMulNBits", ["scaled", "wq", "scales"], ["packed"], domain="com.microsoft", K=8, N=16, bits=8,
            block_size=8,
        ),
        constant("split", np.array([8, 8], np.int64)),
        helper.make_node("Split", ["packed", "split"], ["q", "kv"], axis=-1),
        constant("shape", np.array([0, -1, 8], np.int64)),
        helper.make_node("Reshape", ["kv", "shape"], ["kv3"]),
        helper.make_node("MatMul", ["kv3", "w"], ["plain"]),
        helper.make_node("MatMul", ["kv3", "s.lora_A"], ["xa"]),
        helper.make_node("MatMul", ["xa", "s.lora_B"], ["xab"]),
        helper.make_node("Add", ["plain", "xab"], ["y"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 8]),
            helper.make_tensor_value_info("s.lora_A", TensorProto.FLOAT, [8, "r"]),
            helper.make_tensor_value_info("s.lora_B", TensorProto.FLOAT, ["r", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 4])],
        [
            numpy_helper.from_array(np.zeros((16, 1, 8), np.uint8), "wq"),
            numpy_helper.from_array(np.ones((16, 1), np.float32), "scales"),
            numpy_helper.from_array(np.ones((8, 4), np.float32), "w"),
            numpy_helper.from_array(np.zeros((8, 1), np.float32), "s.lora_A"),
            numpy_helper.from_array(np.zeros((1, 4), np.float32), "s.lora_B"),
        ],
    )
    stacked = rewrite(helper.make_model(graph).SerializeToString(), "the graph")
    assert [slot.name for slot in stacked.slots] == ["s.lora_A", "s.lora_B"]
    gathers = [n for n in onnx.load_from_string(stacked.model).graph.node if n.op_type == "Gather"]
    assert [list(n.input) for n in gathers] == [["s.lora_A", "lora_index"], ["s.lora_B", "lora_index"]]

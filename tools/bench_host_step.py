"""Micro-measurements behind docs/BENCHMARKS.md's host and logits-chain notes, each an in-process A/B.

    .venv/bin/python tools/bench_host_step.py sessions MODEL     # three sessions of MODEL, step time by load order
    DECOCTL_HUGE_PAGES=0 .venv/bin/python tools/bench_host_step.py sessions MODEL    # the same without huge pages
    .venv/bin/python tools/bench_host_step.py fast-path MODEL    # runner through onnxruntime's C++ objects vs wrappers
    .venv/bin/python tools/bench_host_step.py lengths MODEL      # sequence lengths fed vs the graph's mask subgraph
    .venv/bin/python tools/bench_host_step.py chain MODEL "top_k=40,top_p=0.95,temperature=0.8"   # per processor
    .venv/bin/python tools/bench_host_step.py layers MODEL       # generate() vs a bare Sequence loop vs ort-genai
    .venv/bin/python tools/bench_host_step.py heads TARGET --head HEAD   # an EAGLE head's step, narrowed variants
    .venv/bin/python tools/bench_host_step.py outside-run pycode --prompts examples/real_model_prompts.jsonl
                                                   # each strategy's host work outside onnxruntime's Run, a token
    .venv/bin/python tools/bench_host_step.py gated-off pycode --prompts examples/code_prompts.jsonl
                                                   # the same with every gate stopped (plain steps only), and the
                                                   # Python calls a token (cProfile), which no load moves

Runs with decoctl's own venv, one intra-op thread. Each mode alternates its contenders round by round and prints
medians (microseconds or milliseconds a step), so drift in machine load hits all alike; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from decoctl.generation import Generator
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model._runner import binding_calls

PROMPT = "def fibonacci(n):\n"


def decode_loop(sequence: Sequence, steps: int = 128) -> float:
    """Microseconds a one-token step, greedy, after a 12-token prefix."""
    sequence.rewind(0)
    sequence.forward(np.arange(10, 22))
    token = 5
    started = time.perf_counter()
    for _ in range(steps):
        token = int(sequence.forward((token,))[-1].argmax())
    return (time.perf_counter() - started) / steps * 1e6


def alternate(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    results: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            results[name].append(contenders[name]())
    return {name: statistics.median(values) for name, values in results.items()}


def sessions(model: str, rounds: int) -> None:
    # huge pages as the command line loads models; DECOCTL_HUGE_PAGES=0 turns them off for the comparison
    loaded = [
        Sequence("target", load_model(model, threads=1, name=f"s{i}", huge_pages=True), max_length=256)
        for i in range(3)
    ]
    medians = alternate({f"session {i + 1}": (lambda s=s: decode_loop(s)) for i, s in enumerate(loaded)}, rounds)
    for name, value in medians.items():
        print(f"{name} (loaded {name[-1]}): {value / 1000:.2f} ms a step")


def fast_path(model: str, rounds: int) -> None:
    loaded = load_model(model, threads=1)
    fast = Sequence("target", loaded, max_length=256)
    wrapped = Sequence("target", loaded, max_length=256)
    # the public onnxruntime wrappers, as before the fast path
    wrapped._runner._fast = binding_calls(loaded.session, wrapped._runner._binding, private=False)
    medians = alternate({"C++ objects": lambda: decode_loop(fast), "wrappers": lambda: decode_loop(wrapped)}, rounds)
    for name, value in medians.items():
        print(f"{name}: {value:.1f} us a step")


def lengths(model: str, rounds: int) -> None:
    """A step with GroupQueryAttention's lengths fed (the loader's rewrite) against the graph's own mask subgraph,
    two sessions of the same model in one process, alternating round by round."""
    fed = Sequence("target", load_model(model, threads=1), max_length=256)
    masked = Sequence("target", load_model(model, threads=1, feed_lengths=False), max_length=256)
    if fed.model.capabilities.fed_lengths is None:
        raise SystemExit(f"{model}: the loader kept its graph (see the decoctl.mask_subgraph_kept event)")
    contenders = {"lengths fed": lambda: decode_loop(fed), "mask subgraph": lambda: decode_loop(masked)}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for index in range(rounds):
        for name in list(contenders) if index % 2 == 0 else list(contenders)[::-1]:
            samples[name].append(contenders[name]())
    for name, values in samples.items():
        print(f"{name}: {statistics.median(values):.1f} us a step")
    paired = [m / f for f, m in zip(samples["lengths fed"], samples["mask subgraph"], strict=True)]
    print(f"mask subgraph / lengths fed, median of paired rounds: {statistics.median(paired):.3f}")


def chain(model: str, processors: str, rounds: int) -> None:
    """Per token inside the generation loop: each chain step as run, and the host's part around them (building
    the processing context, the argmax check, the commit), beside the same host calls in plain greedy."""
    from decoctl.host import Host
    from decoctl.processing import ProcessorChain

    def wrap(owner: type, attribute: str, name: str, spent: dict[str, float]) -> Callable[[], None]:
        call = owner.__dict__.get(attribute)
        if call is None:  # an older ProcessorChain without this stage
            return lambda: None

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - started

        setattr(owner, attribute, timed)
        return lambda: setattr(owner, attribute, call)

    def host_calls(spent: dict[str, float]) -> list[Callable[[], None]]:
        return [
            wrap(Host, "argmax", "host.argmax (all of it)", spent),
            wrap(Host, "commit", "host.commit (all of it)", spent),
            wrap(Host, "_process_context", "  processing context", spent),
            wrap(ProcessorChain, "_keeps", "  argmax check (processed rows)", spent),
            wrap(ProcessorChain, "_keeps_unprocessed", "  argmax check (unprocessed rows)", spent),
        ]

    def run(generator: Generator, spent: dict[str, float]) -> int:
        undo = host_calls(spent)
        try:
            return sum(generator.generate(PROMPT, max_new_tokens=128).stats.new_tokens for _ in range(rounds))
        finally:
            for restore in undo:
                restore()

    plain = Generator({"target": model}, "greedy", threads=1)
    generator = Generator({"target": model}, "greedy", processors=processors, threads=1)
    steps: dict[str, float] = {}
    for processor in generator.chain.steps:  # as run: fused neighbours (a CandidateRun) time as one
        name = type(processor).__name__
        if hasattr(processor, "steps"):
            name += f"({', '.join(type(step).__name__ for step in processor.steps)})"
        undo = wrap(type(processor), "__call__", "  " + name, steps)
        del undo
    greedy_spent: dict[str, float] = {}
    greedy_tokens = run(plain, greedy_spent)
    spent: dict[str, float] = {}
    tokens = run(generator, spent)
    for name, seconds in {**spent, **steps}.items():
        print(f"{name}: {seconds / tokens * 1e6:.1f} us a token inside the generation loop")
    print(f"all steps: {sum(steps.values()) / tokens * 1e6:.1f} us a token")
    for name, seconds in greedy_spent.items():
        print(f"plain greedy {name.strip()}: {seconds / greedy_tokens * 1e6:.1f} us a token")


def layers(model: str, rounds: int) -> None:
    """Where a greedy step's time goes above onnxruntime: decoctl's generate(), a bare loop over decoctl's Sequence
    (forward + argmax, nothing else), and onnxruntime-genai's own loop when installed; 128 tokens each."""
    generator = Generator({"target": model}, "greedy", threads=1)
    ids = np.asarray(generator.tokenizer.encode(PROMPT), np.int64)

    def generate() -> float:
        stats = generator.generate(PROMPT, max_new_tokens=128).stats
        return stats.decode_seconds / (stats.new_tokens - 1) * 1e6

    def bare() -> float:
        sequence = generator._sequence("target", len(ids) + 128)
        row = sequence.prefill(ids)[0]
        started = time.perf_counter()
        for _ in range(127):
            row = sequence.forward((int(row.argmax()),))[-1]
        return (time.perf_counter() - started) / 127 * 1e6

    contenders = {"decoctl generate()": generate, "bare Sequence loop": bare}
    try:
        import onnxruntime_genai as og
    except ImportError:
        og = None
    if og is not None:
        from decoctl.bench._contenders import OrtGenaiContender

        genai = OrtGenaiContender(generator.models["target"], 1)

        def genai_loop() -> float:
            outcome = genai.run(PROMPT, ids.tolist(), 128)
            return outcome.decode_seconds / max(1, outcome.target_forwards) * 1e6

        contenders["onnxruntime-genai"] = genai_loop
    for name, value in alternate(contenders, rounds).items():
        print(f"{name}: {value:.0f} us a token")


def heads(target: str, head: str, rounds: int) -> None:
    """One-token steps of an exported EAGLE head (tools/export_eagle.py) and of copies of it with a narrower MLP
    and/or an lm_head of the first 1024 columns (timing only: the copies' weights are cut, not trained), beside
    one-token steps of the target. 100 tokens cached, 60 steps a round."""
    import tempfile

    import onnx
    from onnx import numpy_helper

    from decoctl.testing._eagle import DRAFT_IDS, HEAD_WEIGHTS, write_eagle_head

    stored = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(Path(head) / "model.onnx")).graph.initializer}
    base = {name: stored["model." + name] for name in HEAD_WEIGHTS}
    config = json.loads((Path(head) / "genai_config.json").read_text())["model"]["decoder"]
    inner = base["layers.0.gate_proj"].shape[1]
    folder = Path(tempfile.mkdtemp(prefix="decoctl-heads-"))

    def variant(name: str, mlp: int, columns: int | None) -> Sequence:
        weights = dict(base)
        if mlp < inner:
            weights |= {f"layers.0.{k}": weights[f"layers.0.{k}"][:, :mlp].copy() for k in ("gate_proj", "up_proj")}
            weights["layers.0.down_proj"] = weights["layers.0.down_proj"][:mlp].copy()
        if columns is not None:
            weights |= {"lm_head": weights["lm_head"][:, :columns].copy(), DRAFT_IDS: np.arange(columns)}
        write_eagle_head(
            folder / name,
            weights,
            target,
            num_heads=config["num_attention_heads"],
            num_kv_heads=config["num_key_value_heads"],
            max_length=512,
        )
        return Sequence(name, load_model(folder / name, threads=1), max_length=512)

    narrow = max(1, inner * 3 // 8)
    sequences = {
        f"head, MLP {inner}, every column": variant("full", inner, None),
        f"head, MLP {narrow}, every column": variant("mlp", narrow, None),
        f"head, MLP {inner}, 1024 columns": variant("vocab", inner, 1024),
        f"head, MLP {narrow}, 1024 columns": variant("both", narrow, 1024),
    }
    features = np.random.default_rng(0).normal(size=(100, base["fc_bias"].size)).astype(np.float32)

    def steps(sequence: Sequence, with_features: bool) -> float:
        sequence.rewind(0)
        sequence.forward(np.arange(5, 105), features=features if with_features else None)
        started = time.perf_counter()
        for _ in range(60):
            sequence.forward((7,), features=features[:1] if with_features else None)
        return (time.perf_counter() - started) / 60 * 1e6

    contenders = {name: (lambda s=s: steps(s, True)) for name, s in sequences.items()}
    the_target = Sequence("target", load_model(target, threads=1), max_length=512)
    contenders["target"] = lambda: steps(the_target, False)
    for name, value in alternate(contenders, rounds).items():
        print(f"{name}: {value:.0f} us a step")


def outside_run(model: str, prompts_file: str, rounds: int) -> None:
    """Greedy and the drafting strategies with their defaults on ``model`` (its bundled draft and head roles),
    96 new tokens a prompt after a warm-up pass: the microseconds a committed token spends outside onnxruntime's
    Run (host, controller, Python), the Runs a token and the Run milliseconds a token."""
    from decoctl.model import _runner as runner_module

    spent = [0.0, 0]
    run = runner_module.Runner.run

    def timed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        try:
            return run(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - began
            spent[1] += 1

    prompts = [json.loads(line)["prompt"] for line in Path(prompts_file).read_text(encoding="utf-8").splitlines()]
    contenders = {
        "greedy": ({"target": model}, "greedy", {}),
        "speculative": ({"target": model, "draft": f"{model}-draft"}, "speculative", {}),
        "prompt lookup": ({"target": model}, "speculative", {"drafter": "prompt-lookup"}),
        "lookahead": ({"target": model}, "lookahead", {}),
        "eagle": ({"target": model, "eagle": f"{model}-eagle"}, "eagle", {}),
    }
    runner_module.Runner.run = timed  # type: ignore[method-assign]
    try:
        for name, (roles, controller, options) in contenders.items():
            generator = Generator(roles, controller, options=options, threads=1)
            for prompt in prompts:
                generator.generate(prompt, max_new_tokens=96)
            spent[:] = [0.0, 0]
            tokens, began = 0, time.perf_counter()
            for _ in range(rounds):
                for prompt in prompts:
                    tokens += len(generator.generate(prompt, max_new_tokens=96).tokens)
            wall = time.perf_counter() - began
            print(
                f"{name:14s} {tokens / wall:7.1f} tok/s  Runs a token {spent[1] / tokens:.3f}  Run ms a token "
                f"{spent[0] / tokens * 1e3:.3f}  outside Run {(wall - spent[0]) / tokens * 1e6:6.1f} us a token"
            )
    finally:
        runner_module.Runner.run = run  # type: ignore[method-assign]


def gated_off(model: str, prompts_file: str, rounds: int) -> None:
    """outside-run's contenders with drafting stopped for good after a warm-up pass (every remembered gate stopped,
    its next probe beyond the run), so that every step but a generation's first few is the plain step a gated-off
    controller takes where drafting does not pay: the microseconds of CPU a token outside onnxruntime's Run (the
    thread's CPU time, which time spent descheduled on a busy machine does not inflate; one intra-op thread runs the
    Run on this thread; medians of ``rounds`` passes alternating the contenders) and the Python function calls a
    token (cProfile: a count, the same on a busy machine as on a quiet one). Every output is checked equal to
    greedy's."""
    import cProfile
    import pstats

    from decoctl import draft_length
    from decoctl.model import _runner as runner_module

    spent = [0.0]
    run = runner_module.Runner.run

    def timed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        began = time.thread_time()
        try:
            return run(self, *args, **kwargs)
        finally:
            spent[0] += time.thread_time() - began

    def stop_every_gate() -> None:
        for _, rules in getattr(draft_length._kept, "rules", {}).values():
            for rule in rules.values():
                gate = getattr(rule, "gate", rule)
                if isinstance(gate, draft_length.DraftGate):
                    gate.stopped, gate._trial, gate._wait = True, 0, 1 << 30

    prompts = [json.loads(line)["prompt"] for line in Path(prompts_file).read_text(encoding="utf-8").splitlines()]
    contenders = {
        "greedy": ({"target": model}, "greedy", {}),
        "draft model": ({"target": model, "draft": f"{model}-draft"}, "speculative", {}),
        "prompt lookup": ({"target": model}, "speculative", {"drafter": "prompt-lookup"}),
        "lookahead": ({"target": model}, "lookahead", {}),
        "eagle": ({"target": model, "eagle": f"{model}-eagle"}, "eagle", {}),
    }
    generators = {
        name: Generator(roles, controller, options=options, threads=1)
        for name, (roles, controller, options) in contenders.items()
    }
    expected = [generators["greedy"].generate(prompt, max_new_tokens=96).tokens for prompt in prompts]
    for name, generator in generators.items():
        generator.generate(prompts[0], max_new_tokens=96)  # the rules learn the unit and the costs
        stop_every_gate()
        got = [generator.generate(prompt, max_new_tokens=96).tokens for prompt in prompts]
        if got != expected:
            raise SystemExit(f"{name}: outputs differ from greedy's")

    def outside(generator: Generator) -> float:
        spent[0] = 0.0
        tokens, began = 0, time.thread_time()
        for prompt in prompts:
            tokens += len(generator.generate(prompt, max_new_tokens=96).tokens)
        return (time.thread_time() - began - spent[0]) / tokens * 1e6

    runner_module.Runner.run = timed  # type: ignore[method-assign]
    try:
        medians = alternate({name: (lambda g=g: outside(g)) for name, g in generators.items()}, rounds)
    finally:
        runner_module.Runner.run = run  # type: ignore[method-assign]
    for name, generator in generators.items():
        profile = cProfile.Profile()
        profile.enable()
        tokens = sum(len(generator.generate(prompt, max_new_tokens=96).tokens) for prompt in prompts)
        profile.disable()
        calls = pstats.Stats(profile).total_calls / tokens  # type: ignore[attr-defined]
        print(f"{name:14s} CPU outside Run {medians[name]:6.1f} us a token   Python calls a token {calls:6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "mode", choices=("sessions", "fast-path", "lengths", "chain", "layers", "heads", "outside-run", "gated-off")
    )
    parser.add_argument("--head", help="heads: an exported EAGLE head folder")
    parser.add_argument("model")
    parser.add_argument("processors", nargs="?", default="top_k=40,top_p=0.95,temperature=0.8")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--prompts", default="examples/real_model_prompts.jsonl", help="outside-run, gated-off: a prompts file"
    )
    args = parser.parse_args()
    if args.mode == "sessions":
        sessions(args.model, args.rounds)
    elif args.mode == "fast-path":
        fast_path(args.model, max(args.rounds, 20))
    elif args.mode == "lengths":
        lengths(args.model, max(args.rounds, 30))
    elif args.mode == "heads":
        heads(args.model, args.head, max(args.rounds, 8))
    elif args.mode == "layers":
        layers(args.model, max(args.rounds, 14))
    elif args.mode == "outside-run":
        outside_run(args.model, args.prompts, min(args.rounds, 3))
    elif args.mode == "gated-off":
        gated_off(args.model, args.prompts, args.rounds)
    else:
        chain(args.model, args.processors, args.rounds)


if __name__ == "__main__":
    main()

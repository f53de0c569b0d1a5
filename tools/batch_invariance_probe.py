"""Where a row's logits depend on what else a Run computes: the operators alone, then whole models.

    .venv/bin/python tools/batch_invariance_probe.py                      # operators, the demo model, tiny fp32/int8
    .venv/bin/python tools/batch_invariance_probe.py --model PATH --threads 1

Each line compares a way of computing some rows with the way ``decoctl generate`` computes them alone and gives the
largest |difference| (0 = bitwise equal):

- operators: MatMul over M rows (each row against M = 1), MatMulNBits with 8-bit weights at accuracy level 4 (int8
  activations, the builder's CPU default) and 0 (float32), GroupQueryAttention fed a prompt in chunks (each query
  row against the whole prompt in one forward: a one-query chunk takes another kernel);
- models: a batched one-token step over k rows against each row's one-row step; a prompt prefilled in chunks of c
  tokens against whole (the next step's logits); a 300-token prompt split into two chunks at every point against
  whole (the last row); a verify forward of n tokens against n one-token steps; the prompt's last token fed as a
  one-token step (the server's batched Run) against the prompt's own forward.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from decoctl import load_model
from decoctl.host import Rows, Sequence
from decoctl.model import LoadedModel

DEMO = Path(__file__).resolve().parent.parent / "plugins" / "models" / "decoctl_models" / "pycode"


def _session(graph: object, threads: int) -> ort.InferenceSession:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _fmt(diffs: dict[object, float]) -> str:
    return "  ".join(f"{key}: {value:.1e}" if value else f"{key}: 0" for key, value in diffs.items())


def probe_operators(threads: int) -> None:
    rng = np.random.default_rng(0)
    k, n = 384, 4096
    weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    x = rng.standard_normal((64, k)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(weight, "w")],
    )
    sizes = (2, 3, 8, 16, 64)

    def rows_against_one(session: ort.InferenceSession) -> dict[object, float]:
        one = np.concatenate([session.run(None, {"x": x[i : i + 1]})[0] for i in range(64)])
        return {f"M={m}": float(np.abs(session.run(None, {"x": x[:m]})[0] - one[:m]).max()) for m in sizes}

    print(f"MatMul [M,{k}]x[{k},{n}] fp32, each row against M=1:   {_fmt(rows_against_one(_session(graph, threads)))}")
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    for level in (4, 0):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, accuracy_level=level, bits=8)
        quantizer = MatMulNBitsQuantizer(model, algo_config=config)
        quantizer.process()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(
            quantizer.model.model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        print(f"MatMulNBits 8-bit accuracy_level={level}, against M=1:    {_fmt(rows_against_one(session))}")
    probe_attention(threads)


def probe_attention(threads: int) -> None:
    rng = np.random.default_rng(1)
    heads, size, room, length = 6, 64, 512, 300
    inverse = 1.0 / (10000 ** (np.arange(0, size, 2) / size))
    angles = np.outer(np.arange(room), inverse)
    node = helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin"],
        ["o", "ok", "ov"],
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=heads,
        do_rotary=1,
        scale=size**-0.5,
    )
    width = heads * size
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, "s", width]) for name in ("q", "k", "v")] + [
        helper.make_tensor_value_info("pk", TensorProto.FLOAT, [1, heads, room, size]),
        helper.make_tensor_value_info("pv", TensorProto.FLOAT, [1, heads, room, size]),
        helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("o", "ok", "ov")]
    tables = [
        numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
        numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
    ]
    session = _session(helper.make_graph([node], "gqa", inputs, outputs, tables), threads)
    q, k, v = (rng.standard_normal((1, length, width)).astype(np.float32) for _ in range(3))

    def run(chunks: list[int]) -> np.ndarray:
        past_k = np.zeros((1, heads, room, size), np.float32)
        past_v = np.zeros_like(past_k)
        rows, done = [], 0
        for chunk in chunks:
            part = slice(done, done + chunk)
            feed = {"q": q[:, part], "k": k[:, part], "v": v[:, part], "pk": past_k, "pv": past_v}
            feed |= {"seqlens": np.array([done + chunk - 1], np.int32), "total": np.array(done + chunk, np.int32)}
            out, past_k[...], past_v[...] = session.run(None, feed)
            rows.append(out[0])
            done += chunk
        return np.concatenate(rows)

    whole = run([length])
    diffs = {}
    for name, chunks in (
        ("1s", [1] * length),
        ("2s", [2] * (length // 2)),
        ("7s", [7] * (length // 7) + [length % 7]),
        ("64s", [64] * (length // 64) + [length % 64]),
        ("299+1", [length - 1, 1]),
        ("1+299", [1, length - 1]),
    ):
        got = run(chunks)
        differ = np.abs(got - whole).max(axis=1)
        diffs[name] = f"{differ.max():.1e} ({int((differ > 0).sum())} rows)" if differ.max() else "0"
    print(
        f"GroupQueryAttention, a {length}-token prompt in chunks against whole (rows that differ): "
        + "  ".join(f"{key}: {value}" for key, value in diffs.items())
    )


def probe_model(model: LoadedModel, label: str) -> None:
    rng = np.random.default_rng(0)
    vocab = model.spec.vocab_size
    room = 512
    prompts = [rng.integers(3, vocab, size=int(n)) for n in rng.integers(20, 300, size=8)]
    tokens = rng.integers(3, vocab, size=8)

    def one_row(prompt: np.ndarray, token: int, chunk: int | None = None) -> np.ndarray:
        sequence = Sequence("target", model, max_length=room)
        sequence.prefill(prompt, chunk=chunk)
        return np.asarray(sequence.forward((int(token),)))[0].copy()

    alone = [one_row(p, t) for p, t in zip(prompts, tokens, strict=True)]
    rows = Rows("target", model, capacity=8, max_length=room)
    for _ in range(7):
        rows.fork(0)
    for row, prompt in enumerate(prompts):
        rows[row].prefill(prompt)
    widths = {}
    for width in (2, 4, 8):
        out = rows.step(tokens[:width], rows=list(range(width))).copy()
        widths[f"k={width}"] = max(float(np.abs(out[r] - alone[r]).max()) for r in range(width))
        for row in range(width):
            rows[row].rewind(len(prompts[row]))
    print(f"{label}: a batched step of k rows, each against its one-row step:   {_fmt(widths)}")
    chunked = {}
    for chunk in (1, 2, 3, 16, 64):
        chunked[f"c={chunk}"] = max(
            float(np.abs(one_row(p, t, chunk) - a).max()) for p, t, a in zip(prompts[:4], tokens, alone, strict=False)
        )
    print(f"{label}: prompts in chunks of c (the next step's logits) against whole: {_fmt(chunked)}")
    split_prompt = rng.integers(3, vocab, size=300)
    whole_row = _last_row(model, room, split_prompt, [len(split_prompt)])
    differ = [
        size
        for size in range(len(split_prompt) - 2, 1, -1)
        if not np.array_equal(_last_row(model, room, split_prompt, [len(split_prompt) - size, size]), whole_row)
    ]
    print(
        f"{label}: a 300-token prompt as two chunks (>= 2 tokens each) against whole, the last chunk sizes whose "
        f"last row differs: {differ or 'none'}"
    )
    verify = {}
    for n in (2, 5):
        sequence = Sequence("target", model, max_length=room)
        sequence.prefill(prompts[0])
        many = np.asarray(sequence.forward(tokens[:n])).copy()
        single = Sequence("target", model, max_length=room)
        single.prefill(prompts[0])
        steps = np.stack([np.asarray(single.forward((int(t),)))[0].copy() for t in tokens[:n]])
        verify[f"n={n}"] = float(np.abs(many - steps).max())
    print(f"{label}: a verify forward of n tokens against n one-token steps:      {_fmt(verify)}")
    last = {}
    for index, prompt in enumerate(prompts[:4]):
        whole = Sequence("target", model, max_length=room)
        row = np.asarray(whole.prefill(prompt))[0].copy()
        split = Sequence("target", model, max_length=room)
        split.prefill(prompt[:-1])
        stepped = np.asarray(split.forward((int(prompt[-1]),)))[0]
        last[f"prompt {index}"] = float(np.abs(row - stepped).max())
    print(f"{label}: a prompt's last token as a one-token step against in-prompt:   {_fmt(last)}")


def _last_row(model: LoadedModel, room: int, prompt: np.ndarray, chunks: list[int]) -> np.ndarray:
    """The prompt's last row of logits, the prompt fed in forwards of ``chunks`` tokens."""
    sequence = Sequence("target", model, max_length=room)
    done, row = 0, np.zeros(0, np.float32)
    for size in chunks:
        row = np.asarray(sequence.prefill(prompt[done : done + size]))[0]
        done += size
    return row.copy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="a model folder (default: the demo model and tiny ones)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--no-operators", action="store_true", help="skip the operators alone")
    args = parser.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, {args.threads} thread(s)")
    if not args.no_operators:
        probe_operators(args.threads)
    if args.model:
        for folder in args.model:
            probe_model(load_model(folder, threads=args.threads), Path(folder).name)
        return 0
    probe_model(load_model(DEMO, threads=args.threads), "demo pycode")
    from decoctl.testing import build_genai_model, quantize_int8

    with tempfile.TemporaryDirectory() as scratch:
        tiny = build_genai_model(Path(scratch) / "tiny", seed=3, max_length=1024, tree_inputs=True)
        probe_model(load_model(tiny, threads=args.threads), "tiny fp32")
        for level in (4, 0):
            int8 = quantize_int8(tiny, Path(scratch) / f"int8-{level}", accuracy_level=level)
            probe_model(load_model(int8, threads=args.threads), f"tiny int8 (accuracy_level {level})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

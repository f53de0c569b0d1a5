"""Training tokens/s of an EAGLE-3 head, several settings side by side in one process, their steps interleaved.

Reads a ``decoctl eagle train`` run folder for its target and its extracted features (``DIR/features``), builds one
head per setting (``VOCAB:PRECISION``: the draft vocabulary, the most frequent tokens of the run's windows, and fp32 or
bf16 products) and times training steps (the trainer's own losses, backward and AdamW step) on the same batches,
round by round, so that load on a shared machine hits every setting alike::

    .venv/bin/python tools/bench_eagle_train.py ~/.local/share/decoctl/eagle-gemma/run \\
        --settings 32768:fp32,32768:bf16,8192:bf16 --threads 2 --rounds 6

Prints each setting's median step time, training tokens/s and its ratio to the first setting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from decoctl_eagle.target import read_target
from decoctl_eagle.training import data as text
from decoctl_eagle.training.features import FeatureStore
from decoctl_eagle.training.loop import Batch, _losses, autocast
from decoctl_eagle.training.model import Head

from decoctl import PluginRegistry, resolve_model
from decoctl.model.eagle_graph import EAGLE3, HeadDims


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a decoctl eagle train run folder with extracted features")
    parser.add_argument("--settings", default="32768:fp32,32768:bf16,8192:bf16", help="VOCAB:PRECISION,...")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6, help="timed steps per setting (after one untimed)")
    parser.add_argument("--batch", type=int, default=8, help="windows a step")
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--intermediate", type=int, help="the MLP's width (default: twice the hidden size)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = json.loads((args.run / "run.json").read_text())
    _, target_path = resolve_model(settings["target"], PluginRegistry())
    target = read_target(target_path)
    store = FeatureStore(
        args.run / "features",
        kind="aux",
        width=3 * target.hidden_size,
        topk=settings["label_topk"],
        dtype=settings["feature_dtype"],
        fingerprint=settings["fingerprint"],
    )
    windows = store.windows(heldout=False)
    with np.load(args.run / "windows.npz") as cached:
        counts = np.bincount(cached["ids"], minlength=target.vocab_size)[: target.vocab_size]
    decoder = json.loads((target.folder / "genai_config.json").read_text())["model"]["decoder"]
    embed = target.embeddings()
    lm_head = target.lm_head()
    contenders = []
    for spec in args.settings.split(","):
        vocab, precision = spec.split(":")
        ids = text.frequent_tokens(counts, int(vocab))
        dims = HeadDims(
            architecture=EAGLE3,
            hidden=target.hidden_size,
            num_heads=int(decoder["num_attention_heads"]),
            num_kv_heads=int(decoder.get("num_key_value_heads", decoder["num_attention_heads"])),
            head_size=int(decoder.get("head_size") or target.hidden_size // decoder["num_attention_heads"]),
            intermediate=args.intermediate or 2 * target.hidden_size,
            vocab=target.vocab_size,
            draft_vocab=len(ids),
        )
        head = Head(dims, embed, draft_ids=ids, target_lm_head=lm_head)
        optimizer = torch.optim.AdamW(head.parameters(), lr=1e-4)
        contenders.append((spec, head, optimizer, precision == "bf16", head.draft_index(), head.draft_ids()))
    batches = [Batch.of(store, windows[i * args.batch : (i + 1) * args.batch]) for i in range(args.rounds + 1)]
    times: dict[str, list[float]] = {spec: [] for spec, *_ in contenders}
    for index, batch in enumerate(batches):
        for spec, head, optimizer, bf16, draft_index, draft_ids in contenders:
            began = time.perf_counter()
            with autocast(torch.device("cpu"), bf16):
                loss, _ = _losses(head, batch, args.ttt_steps, draft_index, draft_ids, 0.0, 0, measured=1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if index:  # the first round allocates
                times[spec].append(time.perf_counter() - began)
    tokens = statistics.median(b.tokens for b in batches)
    first = statistics.median(times[contenders[0][0]])
    print(f"{args.threads} threads, {args.rounds} rounds, {tokens} tokens a step, ttt steps {args.ttt_steps}")
    for spec, *_ in contenders:
        step = statistics.median(times[spec])
        print(f"{spec:>12}: {step:.2f} s a step, {tokens / step:.0f} training tokens/s, {first / step:.2f}x")


if __name__ == "__main__":
    main()

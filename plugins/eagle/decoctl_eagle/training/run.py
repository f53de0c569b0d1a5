"""One ``decoctl eagle train`` run: settings, data, features, the head, training, export and registration.

``DIR`` (``--out``) holds everything a run needs to go on later: ``run.json`` (the settings that fix what is
trained: target, data, architecture, sizes, batch, learning rate, seed), ``distill.json`` (the target's own
continuations, generated once), ``features/`` (decoctl_eagle.training.features), ``checkpoint.pt``
(decoctl_eagle.training.loop) and ``head/``, the exported ONNX head. ``--resume`` continues from there; the
settings in run.json win, and giving one of them with another value is an error; the budget (--epochs,
--max-tokens) is kept from the last invocation unless given again.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from decoctl import ConfigError, PluginRegistry, Sequence, load_model, resolve_model
from decoctl.logs import get_logger
from decoctl.model.eagle_graph import EAGLE1, EAGLE3, HeadDims
from decoctl_eagle.fit import HeadShape, check_fits
from decoctl_eagle.target import Target, read_target
from decoctl_eagle.training import data as text
from decoctl_eagle.training.export import export_head
from decoctl_eagle.training.features import FeatureStore
from decoctl_eagle.training.loop import Budget, Trainer, bf16_native
from decoctl_eagle.training.model import Head, parameter_count

__all__ = ["FIXED", "PER_RUN", "Result", "train"]

log = get_logger(__name__)

RUN_FILE = "run.json"
DISTILL_FILE = "distill.json"
WINDOWS_FILE = "windows.npz"
FORMAT_VERSION = 1
#: settings a run keeps for its life (run.json), with their defaults; None: chosen from the target or the arch
FIXED: dict[str, Any] = {
    "arch": EAGLE3,
    "data": [],
    "distill_prompts": None,
    "distill_tokens": 256,
    "seq_len": 256,
    "batch": 8,
    "lr": 3e-4,
    "ttt_steps": None,
    "draft_vocab": 32768,
    "heads": None,
    "kv_heads": None,
    "head_size": None,
    "intermediate": None,
    "label_topk": 8,
    "feature_dtype": "bfloat16",
    "feature_noise": None,
    "shard_tokens": 65536,
    "heldout_every": 20,
    "seed": 0,
}
#: the invocation settings a resumed run keeps unless they are given again
BUDGET = ("epochs", "max_tokens")
#: settings each invocation may change
PER_RUN: dict[str, Any] = {
    "epochs": 1,
    "max_tokens": None,
    "max_steps": None,
    "checkpoint_minutes": 5.0,
    "eval_tokens": 8192,
    "threads": None,
    "device": "cpu",
    "precision": "auto",
    "register": True,
    "name": None,
    "progress": True,
}


class Result:
    """How a run ended: ``reason`` ("finished" or "stopped"), the last evaluation, the head's folder and the
    registry file it was recorded in (None with --no-register)."""

    def __init__(self, reason: str, metrics: dict[str, Any], head: Path, registry: Path | None, state: dict) -> None:
        self.reason, self.metrics, self.head, self.registry, self.state = reason, metrics, head, registry, state


def train(target: str, out: Path, given: Mapping[str, Any], *, resume: bool, say: Callable[[str], None]) -> Result:
    """Run (or resume) the training run in ``out`` for ``target``; ``given``: the options given on the command
    line (None where not given); ``say``: one line of progress for the user (stderr)."""
    folder = out.expanduser().resolve()
    settings = _settings(folder, target, given, resume)
    # the budget (epochs, max_tokens) carries over to a resumed run unless given again
    defaults = {**PER_RUN, **settings.get("budget", {})}
    per_run = {key: given.get(key) if given.get(key) is not None else default for key, default in defaults.items()}
    settings["budget"] = {key: per_run[key] for key in BUDGET}
    threads = per_run["threads"]
    if threads is not None:
        torch.set_num_threads(int(threads))
    device, bf16 = _device(per_run["device"], per_run["precision"])
    torch.manual_seed(settings["seed"])
    registry = PluginRegistry()
    target_name, target_path = resolve_model(settings["target"], registry)
    model = load_model(target_path, name=target_name, threads=threads)
    described = read_target(target_path, name=target_name)
    kind, width = _feature_kind(settings["arch"], described, model)
    if not model.capabilities.logits_all_positions:
        raise ConfigError(f"target {target_name} returns the last position's logits only: export it with all of them")
    embed = described.embeddings()  # the shared weights first: a target they cannot be read from fails at once
    lm_head = _lm_head(described, settings["arch"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RUN_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")

    windows = _windows(settings, model, folder, threads, say)
    store = FeatureStore(
        folder / "features",
        kind=kind,
        width=width,
        topk=settings["label_topk"],
        dtype=settings["feature_dtype"],
        fingerprint=settings["fingerprint"],
    )
    budget = Budget(
        epochs=int(per_run["epochs"]),
        max_tokens=per_run["max_tokens"],
        max_steps=per_run["max_steps"],
        checkpoint_minutes=float(per_run["checkpoint_minutes"]),
    )
    cap = None if budget.max_tokens is None else int(budget.max_tokens)
    sequence = Sequence("target", model, max_length=max(len(w) for w in windows) + 1)
    with _bar(per_run["progress"], "features", total=sum(len(w) for w in windows)) as advance:
        store.extract(
            sequence,
            iter(windows),
            shard_tokens=settings["shard_tokens"],
            heldout_every=settings["heldout_every"],
            max_train_tokens=cap,
            report=advance,
        )
    say(
        f"features: {store.tokens(heldout=False)} training and {store.tokens(heldout=True)} held-out tokens in "
        f"{folder / 'features'}"
    )

    dims, draft_ids = _dims(settings, described, windows, folder)
    head = Head(dims, embed, draft_ids=draft_ids, target_lm_head=lm_head)
    steps = settings["ttt_steps"]
    noise = settings["feature_noise"]
    trainer = Trainer(
        head,
        store,
        folder,
        steps=steps,
        batch=settings["batch"],
        lr=settings["lr"],
        seed=settings["seed"],
        noise=noise,
        eval_tokens=int(per_run["eval_tokens"]),
        device=device,
        bf16=bf16,
    )
    precision = "bfloat16" if bf16 else "float32"
    say(f"training on {device.type} with {precision} products, {torch.get_num_threads()} threads")
    if trainer.resume():
        say(f"resumed from {folder / 'checkpoint.pt'}: step {trainer.state['step']}, {trainer.state['tokens']} tokens")
    else:
        say(f"a new {dims.architecture.upper()} head: {parameter_count(head) / 1e6:.2f}M trainable parameters")

    def on_eval(entry: dict[str, Any]) -> None:
        say(
            f"step {entry['step']}: held-out top-1 {entry['top1']:.3f}, acceptance length {entry['tau']:.2f} "
            f"(chain of {steps}), loss {entry['loss']:.3f}"
        )

    planned = trainer.planned_tokens(budget)
    with (
        _stop_on_signals() as stopped,
        _bar(per_run["progress"], "training", total=planned, initial=min(planned, trainer.state["tokens"])) as advance,
    ):
        reason = trainer.train(budget, stop=stopped, progress=advance, on_eval=on_eval)
    metrics = trainer.state["evals"][-1]
    if stopped():
        reason = "interrupted"
    training = {
        "out": str(folder),
        "architecture": dims.architecture,
        "steps": trainer.state["step"],
        "tokens": trainer.state["tokens"],
        "epochs": trainer.state["epoch"],
        "seconds": round(trainer.state["seconds"], 1),
        "heldout_top1": round(metrics["top1"], 4),
        "heldout_tau": round(metrics["tau"], 4),
        "ttt_steps": steps,
        "data_tokens": store.tokens(heldout=False),
        "tap_layers": list(described.tap_layers) or None,
        "finished": trainer.done(budget),
    }
    scale = float(np.std(store.read(store.windows(heldout=False)[0])[1])) or 1.0
    head.cpu()  # the export checks the ONNX head against the torch head on the CPU
    export_head(
        head, folder / "head", target_dir=target_path, target_name=target_name, feature_scale=scale, training=training
    )
    recorded = None
    if per_run["register"]:
        from decoctl_eagle.heads import register_head

        name = per_run["name"] or f"{target_name}-eagle-{folder.name}"
        recorded = register_head(
            target_path,
            folder / "head",
            name=name,
            summary=f"{dims.architecture.upper()} head for {target_name}, trained by decoctl eagle train",
            source=str(folder),
            plugins=registry,
        )
    return Result(reason, metrics, folder / "head", recorded, trainer.state)


# -------------------------------------------------------------------------------------------------- settings


def _settings(folder: Path, target: str | None, given: Mapping[str, Any], resume: bool) -> dict[str, Any]:
    """The run's fixed settings: run.json's on --resume (a given option that differs is an error), else the
    given ones over the defaults."""
    path = folder / RUN_FILE
    if path.is_file():
        if not resume:
            raise ConfigError(
                f"{folder} already holds a training run: pass --resume to continue it, or give another --out"
            )
        stored = json.loads(path.read_text(encoding="utf-8"))
        differing = {
            key: (stored.get(key), value)
            for key, value in given.items()
            if key in FIXED and value is not None and _normal(key, value) != stored.get(key)
        }
        if target is not None and str(_resolved_target(target)) != stored["target"]:
            differing["target"] = (stored["target"], target)
        if differing:
            shown = "; ".join(f"--{k.replace('_', '-')} {v[1]} (the run has {v[0]})" for k, v in differing.items())
            raise ConfigError(
                f"--resume continues {folder} as it was set up: {shown}. Leave them out or use another --out"
            )
        return stored
    if target is None:
        raise ConfigError("give --target MODEL: the onnxruntime-genai model the head drafts for")
    settings = {
        key: _normal(key, given[key]) if given.get(key) is not None else default for key, default in FIXED.items()
    }
    if not settings["data"] and not settings["distill_prompts"]:
        raise ConfigError(
            "give training text (--data FILE...) or prompts for the target to continue (--distill-prompts)"
        )
    arch = settings["arch"]
    if settings["ttt_steps"] is None:
        settings["ttt_steps"] = 3 if arch == EAGLE3 else 1
    if settings["feature_noise"] is None:
        settings["feature_noise"] = 0.0 if arch == EAGLE3 else 0.1
    settings["target"] = str(_resolved_target(target))
    inputs = [*settings["data"], *([settings["distill_prompts"]] if settings["distill_prompts"] else [])]
    extra = {k: settings[k] for k in ("target", "arch", "seq_len", "distill_tokens", "label_topk", "heldout_every")}
    settings["fingerprint"] = text.fingerprint(inputs, extra)
    settings["version"] = FORMAT_VERSION
    return settings


def _normal(key: str, value: Any) -> Any:
    """A given option as run.json stores it (paths absolute, architectures spelled as eagle_graph spells them)."""
    if key == "data":
        return [str(Path(p).expanduser().resolve()) for p in value]
    if key == "distill_prompts":
        return str(Path(value).expanduser().resolve())
    if key == "arch":
        return {"eagle3": EAGLE3, "eagle1": EAGLE1}.get(str(value), str(value))
    return value


def _resolved_target(target: str) -> Path:
    return resolve_model(target, PluginRegistry())[1].expanduser().resolve()


def _feature_kind(arch: str, target: Target, model: Any) -> tuple[str, int]:
    """("aux", 3H) for EAGLE-3, ("final", H) for EAGLE-1; refused, naming the fix, when the target lacks them."""
    head = HeadShape(architecture=arch, hidden=target.hidden_size, vocab=target.vocab_size)
    also = " (and train on the copy); or train --arch eagle1 on its final hidden states" if arch == EAGLE3 else ""
    check_fits(head, target.shape, what=f"an {arch.upper()} head", also=also)
    return ("aux", head.taps) if arch == EAGLE3 else ("final", head.hidden)


def _device(name: str, precision: str) -> tuple[torch.device, bool]:
    """The device the head trains on and whether its products run in bfloat16 (``precision`` auto: where the device
    computes bfloat16 in hardware)."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"--device {name}: this torch ({torch.__version__}) sees no CUDA GPU: install torch's CUDA build, or train "
            "on the CPU (--device cpu)"
        )
    if precision not in ("auto", "bf16", "fp32"):
        raise ConfigError(f"--precision {precision}: choose auto, bf16 or fp32")
    return device, precision == "bf16" or (precision == "auto" and bf16_native(device))


# -------------------------------------------------------------------------------------------------- data


def _windows(
    settings: dict[str, Any], model: Any, folder: Path, threads: int | None, say: Callable[[str], None]
) -> list:
    """Every window of the run's data (its files, then the distilled continuations), in a fixed order; encoded once
    and kept in ``DIR/windows.npz`` for the run's later invocations."""
    cache = folder / WINDOWS_FILE
    if cache.is_file():
        with np.load(cache) as stored:
            if str(stored["fingerprint"]) == settings["fingerprint"]:
                return np.split(stored["ids"].astype(np.int64), np.cumsum(stored["lengths"])[:-1])
    bos = text.prompt_bos(model.tokenizer, model.spec.bos_token_id)
    seq_len = settings["seq_len"]
    windows = text.file_windows(settings["data"], model.tokenizer, seq_len, bos)
    for ids in _distilled(settings, folder, threads, say):
        windows.extend(text.windows(ids, seq_len, bos))
    if not windows:
        raise ConfigError("the data holds no text to train on: give --data files with text in them")
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / (WINDOWS_FILE + ".tmp.npz")
    np.savez(
        staging,
        fingerprint=np.array(settings["fingerprint"]),
        ids=np.concatenate(windows).astype(np.int32),
        lengths=np.array([len(w) for w in windows], np.int64),
    )
    staging.replace(cache)
    return windows


def _distilled(settings: dict[str, Any], folder: Path, threads: int | None, say: Callable[[str], None]) -> list:
    if not settings["distill_prompts"]:
        return []
    path = folder / DISTILL_FILE
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored.get("fingerprint") == settings["fingerprint"]:
            return list(stored["sequences"])
    prompts = text.read_prompts(settings["distill_prompts"])
    say(f"distilling: the target continues {len(prompts)} prompts by {settings['distill_tokens']} tokens each")
    began = time.monotonic()
    sequences = text.distill(settings["target"], prompts, settings["distill_tokens"], threads=threads)
    say(f"distilled {sum(len(s) for s in sequences)} tokens in {time.monotonic() - began:.0f}s")
    path.write_text(json.dumps({"fingerprint": settings["fingerprint"], "sequences": sequences}) + "\n")
    return sequences


# -------------------------------------------------------------------------------------------------- the head


def _dims(settings: dict[str, Any], target: Target, windows: list, folder: Path) -> tuple[HeadDims, np.ndarray | None]:
    """The head's sizes (the target's attention shape unless given) and its draft vocabulary: the most frequent
    tokens of the training windows (stored in the run folder, so a resumed run keeps it)."""
    decoder = json.loads((target.folder / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    h = target.hidden_size
    heads = int(settings["heads"] or decoder["num_attention_heads"])
    kv_heads = int(settings["kv_heads"] or decoder.get("num_key_value_heads", heads))
    head_size = int(settings["head_size"] or decoder.get("head_size") or h // heads)
    if heads % kv_heads or head_size % 2:
        raise ConfigError(
            f"--heads {heads} must be a multiple of --kv-heads {kv_heads}, and --head-size {head_size} even"
        )
    vocab = target.vocab_size
    draft_ids = None
    size = vocab
    if settings["arch"] == EAGLE3 and settings["draft_vocab"] < vocab:
        path = folder / "draft_vocab.npy"
        if path.is_file():
            draft_ids = np.load(path)
        else:
            counts = np.bincount(np.concatenate(windows), minlength=vocab)[:vocab]
            draft_ids = text.frequent_tokens(counts, int(settings["draft_vocab"]))
            np.save(path, draft_ids)
        size = len(draft_ids)
    dims = HeadDims(
        architecture=settings["arch"],
        hidden=h,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_size=head_size,
        intermediate=int(settings["intermediate"] or 2 * h),
        vocab=vocab,
        draft_vocab=size,
    )
    return dims, draft_ids


def _lm_head(target: Target, arch: str) -> np.ndarray | None:
    """The target's lm_head: EAGLE-1 drafts through it; an EAGLE-3 head starts from its rows where it can be read."""
    if arch == EAGLE1:
        return target.lm_head()
    try:
        return target.lm_head()
    except Exception as exc:  # a quantized lm_head: the head's own starts at random
        log.info("decoctl.eagle_lm_head_random", reason=str(exc))
        return None


# -------------------------------------------------------------------------------------------------- the terminal


@contextmanager
def _bar(enabled: bool, what: str, *, total: int, initial: int = 0) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr with tokens/s and the time left (tqdm; off with --no-progress or without a
    terminal); yields ``advance(tokens, stats=None)``, ``stats`` (the step's loss and top-1) shown beside it."""
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        initial=initial,
        desc=what,
        unit="tok",
        unit_scale=True,
        file=sys.stderr,
        disable=None if enabled else True,
        dynamic_ncols=True,
        smoothing=0.05,
    )

    def advance(tokens: int, stats: Mapping[str, float] | None = None) -> None:
        if stats:
            bar.set_postfix({k: f"{v:.3f}" for k, v in stats.items()}, refresh=False)
        bar.update(tokens)

    try:
        yield advance
    finally:
        bar.close()


@contextmanager
def _stop_on_signals() -> Iterator[Callable[[], bool]]:
    """SIGINT and SIGTERM ask the run to stop after the step in progress (it then checkpoints and exports); a
    second SIGINT interrupts at once. Only the main thread can install handlers; elsewhere nothing changes."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag.is_set
        return

    def handler(signum: int, _frame: Any) -> None:
        if flag.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag.is_set
    finally:
        for s, h in previous.items():
            signal.signal(s, h)

"""The encoder-decoder demo pair: a small BART that renames a variable in a Python function, and its draft.

Task (copying from the source matters, as in real edits): the source is an instruction line and a function,
``# rename OLD to NEW`` then the function's text; the target is the function with every use of the variable OLD
(a parameter or a local, found with ``ast``: names and arguments, never attributes, keywords or strings) written
NEW. Functions come from the standard library as tools/corpus.py selects it, up to MAX_CODE_TOKENS tokens; the
files tools/heldout_files.txt lists give the evaluation and bench examples, every other file the training ones.
Each epoch draws each training function's variable and its new name afresh (a name the corpus uses elsewhere).

Models (transformers BART, the bundled pycode tokenizer, decoder start token <|bos|>, EOS <|eos|>):
``edit`` (width 128, 3 + 3 layers, 4000 steps of 16: about 20 minutes on one thread here) and ``edit-draft`` (width
64, 1 + 1 layers, 3500 steps: about 9 minutes), trained on the same examples with the same seed; the draft shares
the vocabulary and decoder start token, as decoctl's speculative decoding and transformers' assisted decoding need.
Training is deterministic (fixed seeds and steps, one torch thread) and resumable: a checkpoint every 50 steps under
build/encdec-demo/train/ROLE, picked up by the next run. Held out, greedy gives the expected edit on 29 of 50
examples for ``edit`` and 5 for ``edit-draft``.

Everything, from a fresh clone (in the test-exports environment, which has torch, transformers and optimum-onnx):

    make encdec-demo        # = build/venv-exports/bin/python tools/encdec_demo.py all

Output under build/encdec-demo/: hf/{edit,edit-draft} (transformers checkpoints), {edit,edit-draft} (Optimum ONNX
exports with tokenizer.json, for decoctl), eval.json (exact-match rates on held-out examples). ``prompts`` writes
the bench's held-out prompts to examples/encdec_edit_prompts.jsonl.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import random
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path.insert(0, str(TOOLS))
import corpus  # noqa: E402  (tools/ is not a package)

OUT = REPO / "build" / "encdec-demo"
TOKENIZER = REPO / "plugins" / "models" / "decoctl_models" / "pycode" / "tokenizer.json"
PROMPTS = REPO / "examples" / "encdec_edit_prompts.jsonl"
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
MAX_CODE_TOKENS = 96
#: positions: the instruction and the longest function, and the bench's 128 new tokens after the start token
MAX_POSITIONS = 256
SEED = 20240611
EVAL_EXAMPLES = 50
BENCH_PROMPTS = 16


@attrs.frozen(kw_only=True)
class Preset:
    d_model: int
    layers: int
    heads: int
    ffn: int
    steps: int
    batch: int
    lr: float


PRESETS = {
    "edit": Preset(d_model=128, layers=3, heads=2, ffn=512, steps=4000, batch=16, lr=3e-3),
    "edit-draft": Preset(d_model=64, layers=1, heads=1, ffn=256, steps=3500, batch=16, lr=3e-3),
}
#: the weights' initial spread: BART's own 0.02 leaves the path that copies a source token to the output (the
#: cross-attention's value and output projections) too weak to learn from in this budget (a pure copy on a 1 + 1
#: layer model of width 128: 2.4 nats a token after 800 steps at 0.02, 0.02 after 300 steps at 0.06). Deeper and
#: wider models learn the copy later (3 + 3 layers of width 256 had not begun to after 400 steps), hence the widths
INIT_STD = 0.06


# ---------------------------------------------------------------- examples


@attrs.frozen(kw_only=True)
class Function:
    """A function's dedented text and, per variable worth renaming, where it occurs: (line, byte column)."""

    file: str
    code: str
    names: tuple[str, ...]  # every identifier the function uses (a new name must be none of them)
    variables: dict[str, tuple[tuple[int, int], ...]]


@attrs.frozen(kw_only=True)
class Example:
    source: str
    target: str


def _variables(tree: ast.AST, lines: list[bytes]) -> dict[str, tuple[tuple[int, int], ...]] | None:
    """Each parameter (but self and cls) and assigned local used at least twice -> its occurrences, or None where
    the function rebinds names across scopes (global, nonlocal) or holds f-strings (whose positions are unsafe)."""
    places: dict[str, list[tuple[int, int]]] = {}
    assigned: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global | ast.Nonlocal | ast.JoinedStr):
            return None
        if isinstance(node, ast.Name):
            places.setdefault(node.id, []).append((node.lineno, node.col_offset))
            if isinstance(node.ctx, ast.Store):
                assigned.add(node.id)
        elif isinstance(node, ast.arg):
            places.setdefault(node.arg, []).append((node.lineno, node.col_offset))
            assigned.add(node.arg)
    variables = {}
    for name in sorted(assigned - {"self", "cls"}):
        where = tuple(sorted(set(places[name])))
        raw = name.encode()
        if len(where) < 2 or any(lines[line - 1][col : col + len(raw)] != raw for line, col in where):
            continue
        variables[name] = where
    return variables


def functions(split: str) -> list[Function]:
    """The corpus's functions of ``split`` ("train" or "heldout") that fit MAX_CODE_TOKENS and have a variable."""
    tokenizer = load_tokenizer()
    found = []
    for rel, text in corpus.collect(corpus.stdlib_root()):
        if corpus.is_heldout(rel) != (split == "heldout"):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            code = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno])).rstrip() + "\n"
            if len(tokenizer.encode(code).ids) > MAX_CODE_TOKENS:
                continue
            try:
                own = ast.parse(code)
            except SyntaxError:
                continue
            variables = _variables(own, [line.encode() for line in code.splitlines(keepends=True)])
            if variables:
                names = {n.id for n in ast.walk(own) if isinstance(n, ast.Name)}
                names |= {n.arg for n in ast.walk(own) if isinstance(n, ast.arg)}
                names |= {n.attr for n in ast.walk(own) if isinstance(n, ast.Attribute)}
                found.append(Function(file=rel, code=code, names=tuple(sorted(names)), variables=variables))
    return found


def name_pool(functions_: Sequence[Function]) -> list[str]:
    """New names: the variables the training functions use, each once, sorted (a realistic vocabulary)."""
    return sorted({name for f in functions_ for name in f.variables if len(name) > 1})


def rename(function: Function, old: str, new: str) -> str:
    lines = [line.encode() for line in function.code.splitlines(keepends=True)]
    for line, col in sorted(function.variables[old], reverse=True):
        text = lines[line - 1]
        lines[line - 1] = text[:col] + new.encode() + text[col + len(old.encode()) :]
    return b"".join(lines).decode()


def example(function: Function, pool: Sequence[str], rng: random.Random) -> Example:
    """A rename of one of the function's variables to a name of the pool that the function does not use."""
    old = rng.choice(sorted(function.variables))
    new = rng.choice(pool)
    while new in function.names:
        new = rng.choice(pool)
    return Example(source=f"# rename {old} to {new}\n{function.code}", target=rename(function, old, new))


def heldout_examples(pool: Sequence[str]) -> list[Example]:
    """The held-out examples, one per held-out function, in a fixed shuffled order: the first BENCH_PROMPTS are
    the bench's prompts, the next EVAL_EXAMPLES the evaluation's."""
    rng = random.Random(SEED + 1)
    held = functions("heldout")
    rng.shuffle(held)
    return [example(f, pool, rng) for f in held]


def load_tokenizer() -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER))


# ---------------------------------------------------------------- training


def set_threads() -> None:
    """One thread: the training must be deterministic and leave the machine's other core alone."""
    import torch

    torch.set_num_threads(1)
    if torch.get_num_interop_threads() != 1:  # torch takes it once a process
        torch.set_num_interop_threads(1)


def bart_config(preset: Preset) -> Any:
    import transformers

    return transformers.BartConfig(
        vocab_size=load_tokenizer().get_vocab_size(),
        d_model=preset.d_model,
        encoder_layers=preset.layers,
        decoder_layers=preset.layers,
        encoder_attention_heads=preset.heads,
        decoder_attention_heads=preset.heads,
        encoder_ffn_dim=preset.ffn,
        decoder_ffn_dim=preset.ffn,
        max_position_embeddings=MAX_POSITIONS,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        decoder_start_token_id=BOS_ID,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        no_repeat_ngram_size=0,
        init_std=INIT_STD,
    )


class Batches:
    """Epoch e: every training function once, each with a variable and new name drawn from Random(SEED, e), in
    batches of similar lengths (less padding), the batches in a shuffled order. Deterministic: step s's batch is
    the same in every run, so a resumed run goes on exactly where the checkpoint left it."""

    def __init__(self, train: Sequence[Function], pool: Sequence[str], batch: int) -> None:
        self.train, self.pool, self.batch = train, pool, batch
        self.tokenizer = load_tokenizer()
        self._epoch: int | None = None
        self._batches: list[list[tuple[list[int], list[int]]]] = []

    def __call__(self, step: int) -> list[tuple[list[int], list[int]]]:
        epoch, index = divmod(step, math.ceil(len(self.train) / self.batch))
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, self._make(epoch)
        return self._batches[index]

    def _make(self, epoch: int) -> list[list[tuple[list[int], list[int]]]]:
        rng = random.Random(f"{SEED}:{epoch}")
        order = list(self.train)
        rng.shuffle(order)
        pairs = []
        for function in order:
            drawn = example(function, self.pool, rng)
            pairs.append((self.tokenizer.encode(drawn.source).ids, [*self.tokenizer.encode(drawn.target).ids, EOS_ID]))
        batches = []
        window = self.batch * 32
        for start in range(0, len(pairs), window):
            chunk = sorted(pairs[start : start + window], key=lambda p: len(p[0]) + len(p[1]))
            batches += [chunk[i : i + self.batch] for i in range(0, len(chunk), self.batch)]
        rng.shuffle(batches)
        return batches


def tensors(batch: Sequence[tuple[list[int], list[int]]]) -> dict[str, Any]:
    import torch

    width = max(len(s) for s, _ in batch)
    length = max(len(t) for _, t in batch)
    ids = torch.full((len(batch), width), PAD_ID)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), length), -100)
    for row, (source, target) in enumerate(batch):
        ids[row, : len(source)] = torch.tensor(source)
        mask[row, : len(source)] = 1
        labels[row, : len(target)] = torch.tensor(target)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def learning_rate(preset: Preset, step: int) -> float:
    warmup = min(50, preset.steps // 10)
    if step < warmup:
        return preset.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, preset.steps - warmup)
    return preset.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(role: str, *, minutes: float | None) -> bool:
    """Train ``role`` to its preset's steps (from its checkpoint, if any); save the transformers checkpoint when
    done. ``minutes``: stop (after a checkpoint) once this much time has passed; True when the run is finished."""
    import torch
    import transformers

    set_threads()
    preset = PRESETS[role]
    folder = OUT / "train" / role
    checkpoint = folder / "checkpoint.pt"
    final = OUT / "hf" / role
    if (final / "config.json").exists():
        print(f"{role}: done ({final})")
        return True
    torch.manual_seed(SEED)
    model = transformers.BartForConditionalGeneration(bart_config(preset))
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.98), weight_decay=0.01)
    step = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"{role}: resuming at step {step}")
    train_functions = functions("train")
    batches = Batches(train_functions, name_pool(train_functions), preset.batch)
    print(
        f"{role}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {len(train_functions)} "
        f"training functions, {preset.steps} steps of {preset.batch}"
    )
    model.train()
    started = time.monotonic()
    losses: list[float] = []
    while step < preset.steps:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(preset, step)
        loss = model(**tensors(batches(step))).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step += 1
        if step % 10 == 0:
            rate = (time.monotonic() - started) / len(losses)
            print(
                f"{role} step {step}/{preset.steps} loss {sum(losses[-10:]) / 10:.3f} ({rate:.2f} s/step)", flush=True
            )
        if step % 50 == 0 or step == preset.steps:
            folder.mkdir(parents=True, exist_ok=True)
            scratch = checkpoint.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, scratch)
            os.replace(scratch, checkpoint)
            if minutes is not None and time.monotonic() - started > minutes * 60 and step < preset.steps:
                print(f"{role}: stopped after {minutes} minutes at step {step}; run again to resume")
                return False
    model.eval()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, decoder_start_token_id=BOS_ID
    )
    model.save_pretrained(final)
    write_tokenizer(final)
    print(f"{role}: saved {final}")
    return True


def write_tokenizer(folder: Path) -> None:
    """tokenizer.json and a tokenizer_config.json that transformers 4.x and decoctl both read."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


# ---------------------------------------------------------------- export, evaluation, prompts


def export(role: str) -> Path:
    """Optimum's export of the role's transformers checkpoint (the merged decoder, as optimum-cli writes it)."""
    from optimum.exporters.onnx import main_export

    source, folder = OUT / "hf" / role, OUT / role
    if not (folder / "encoder_model.onnx").exists():
        main_export(str(source), output=folder, task="text2text-generation-with-past", do_validation=False)
    write_tokenizer(folder)
    return folder


def greedy(model: Any, ids: Sequence[int], max_new_tokens: int = 128) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([list(ids)]),
            attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
        )
    return [int(t) for t in out[0, 1:] if int(t) != PAD_ID]


def evaluate() -> dict[str, Any]:
    """Exact-match rates of each role's greedy output on EVAL_EXAMPLES held-out examples (the bench's prompts
    excluded), written to build/encdec-demo/eval.json."""
    import transformers

    set_threads()
    tokenizer = load_tokenizer()
    held = heldout_examples(name_pool(functions("train")))
    chosen = held[BENCH_PROMPTS : BENCH_PROMPTS + EVAL_EXAMPLES]
    report: dict[str, Any] = {"examples": len(chosen), "held_out_functions": len(held)}
    for role in PRESETS:
        model = transformers.BartForConditionalGeneration.from_pretrained(OUT / "hf" / role).eval()
        exact = 0
        for item in chosen:
            out = greedy(model, tokenizer.encode(item.source).ids)
            exact += tokenizer.decode([t for t in out if t != EOS_ID], skip_special_tokens=False) == item.target
        report[role] = {"exact_match": exact / len(chosen)}
        print(f"{role}: exact match {exact}/{len(chosen)} on held-out examples")
    (OUT / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def write_prompts() -> None:
    held = heldout_examples(name_pool(functions("train")))[:BENCH_PROMPTS]
    PROMPTS.write_text("".join(json.dumps({"prompt": item.source}) + "\n" for item in held))
    print(f"wrote {len(held)} prompts to {PROMPTS.relative_to(REPO)}")


def stages(args: argparse.Namespace) -> Iterator[str]:
    yield from ("train", "export", "eval") if args.stage == "all" else (args.stage,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("all", "train", "export", "eval", "prompts"))
    parser.add_argument("--role", choices=sorted(PRESETS), help="train or export only this one (default: both)")
    parser.add_argument("--minutes", type=float, help="train: stop after this long (resume by running again)")
    args = parser.parse_args()
    roles = [args.role] if args.role else list(PRESETS)
    for stage in stages(args):
        if stage == "train":
            for role in roles:
                if not train(role, minutes=args.minutes):
                    sys.exit(2)
        elif stage == "export":
            for role in roles:
                print(f"{role}: exported to {export(role)}")
        elif stage == "eval":
            evaluate()
        else:
            write_prompts()


if __name__ == "__main__":
    main()

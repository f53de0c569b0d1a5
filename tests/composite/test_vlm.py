"""A vision-language model (a tiny LLaVA in onnxruntime-genai's three-graph layout) under the decoder's primitives:
greedy and beam search equal transformers' generate() on the same weights and image, every other strategy equals
greedy, the vision encoder runs once per image per generation, and a decode step is one decoder Run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vlm_models import IMAGE_MARK, IMAGE_TOKENS, Llava

import decoctl
from decoctl import CapabilityError, ConfigError, Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import EOS_TOKEN_ID, PAD_TOKEN_ID, build_genai_model

PROMPT = f"{IMAGE_MARK}\nUSER: what is in the picture? ASSISTANT:"
NEW = 24


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from PIL import Image

    path = tmp_path_factory.mktemp("images") / "noise.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (41, 30, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def other_picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from PIL import Image

    path = tmp_path_factory.mktemp("images") / "stripes.png"
    stripes = np.zeros((28, 28, 3), np.uint8)
    stripes[::3] = 250
    Image.fromarray(stripes).save(path)
    return path


def transformers_generate(llava: Llava, ids: list[int], image: Path, **options: Any) -> list[list[int]]:
    import torch
    from PIL import Image
    from transformers import CLIPImageProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(llava.hf).eval()
    pixels = CLIPImageProcessor.from_pretrained(llava.onnx)(Image.open(image), return_tensors="pt").pixel_values
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            pixel_values=pixels,
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=EOS_TOKEN_ID,
            pad_token_id=PAD_TOKEN_ID,
            **options,
        )
    rows = [row[len(ids) :].tolist() for row in out]
    return [row[: row.index(EOS_TOKEN_ID) + 1] if EOS_TOKEN_ID in row else row for row in rows]  # padding cut


def expanded_prompt(llava: Llava) -> list[int]:
    ids = decoctl.Generator({"target": llava.onnx}, "greedy").tokenizer.encode(PROMPT)
    mark = ids.index(llava.image_token)
    return ids[:mark] + [llava.image_token] * IMAGE_TOKENS + ids[mark + 1 :]


def test_greedy_equals_transformers_on_the_same_weights_and_image(llava: Llava, picture: Path) -> None:
    result = decoctl.generate(PROMPT, model=llava.onnx, images=[picture], max_new_tokens=NEW, threads=1)

    assert [list(result.tokens)] == transformers_generate(llava, expanded_prompt(llava), picture)


def test_the_image_changes_the_answer(llava: Llava, picture: Path, other_picture: Path) -> None:
    first = decoctl.generate(PROMPT, model=llava.onnx, images=[picture], max_new_tokens=NEW, threads=1)
    second = decoctl.generate(PROMPT, model=llava.onnx, images=[other_picture], max_new_tokens=NEW, threads=1)

    assert first.tokens != second.tokens


def test_beam_search_equals_transformers_beam_search(llava: Llava, picture: Path) -> None:
    options = {"num_beams": 3, "num_return_sequences": 2}
    generator = Generator({"target": llava.onnx}, "beam", options=options, threads=1)

    result = generator.generate(PROMPT, images=[picture], max_new_tokens=NEW)

    expected = transformers_generate(llava, expanded_prompt(llava), picture, num_beams=3, num_return_sequences=2)
    assert [list(c.tokens) for c in result.completions] == expected


@pytest.mark.parametrize(
    ("controller", "options", "generator_options"),
    [
        ("speculative", {"drafter": "prompt-lookup"}, {}),
        ("sample", {"temperature": 1e-4}, {}),
        ("greedy", {}, {"prefill_chunk": 3}),  # chunks that cut through the image tokens
    ],
)
def test_other_strategies_and_chunked_prefill_give_greedys_tokens(
    llava: Llava, picture: Path, controller: str, options: dict[str, Any], generator_options: dict[str, Any]
) -> None:
    registry = PluginRegistry()
    greedy = Generator({"target": llava.onnx}, "greedy", registry=registry, threads=1)
    other = Generator(
        {"target": llava.onnx}, controller, options=options, registry=registry, threads=1, **generator_options
    )

    expected = greedy.generate(PROMPT, images=[picture], max_new_tokens=NEW)
    result = other.generate(PROMPT, images=[picture], max_new_tokens=NEW)

    assert result.tokens == expected.tokens


def test_the_vision_encoder_runs_once_per_image_and_a_step_is_one_decoder_run(llava: Llava, picture: Path) -> None:
    generator = Generator(
        {"target": llava.onnx},
        "speculative",
        options={"drafter": "prompt-lookup"},
        registry=PluginRegistry(),
        threads=1,
    )
    vision = generator.models["target"].vision
    assert vision is not None

    generator.generate(PROMPT, images=[picture], max_new_tokens=NEW)  # verification rewinds as it goes

    assert vision.encoder_runs == 1
    assert vision.embedder.graph_runs == 1  # the prefill placed the features; every later forward used the table
    generator.generate(f"{PROMPT} {IMAGE_MARK}", images=[picture, picture], max_new_tokens=4)
    assert vision.encoder_runs == 3


def test_an_image_that_is_not_an_image_is_refused_by_name(llava: Llava, tmp_path: Path) -> None:
    fake = tmp_path / "photo.png"
    fake.write_text("not a picture", encoding="utf-8")

    with pytest.raises(ConfigError, match=r"image 0 \(.*photo.png\) is not an image"):
        decoctl.generate(PROMPT, model=llava.onnx, images=[fake], threads=1)


@pytest.mark.parametrize("count", [0, 2])
def test_images_that_do_not_match_the_prompts_image_tokens_are_refused(llava: Llava, picture: Path, count: int) -> None:
    with pytest.raises(ConfigError, match=rf"holds 1 image token\(s\) \(id {llava.image_token}\) for {count} image"):
        decoctl.generate(PROMPT, model=llava.onnx, images=[picture] * count, threads=1)


def test_an_image_on_a_text_only_model_is_refused(tmp_path: Path, picture: Path) -> None:
    text_only = build_genai_model(tmp_path / "text", seed=1, num_layers=1)

    with pytest.raises(CapabilityError, match="has no vision encoder"):
        decoctl.generate("x", model=text_only, images=[picture], threads=1)

"""A vision-language model behind the server: chat messages carry images as image_url parts (data: URLs only), the
answer equals the offline Generator's on the same messages and image, and bad images are 400s naming the fix."""

from __future__ import annotations

import base64
import shutil
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import pytest

from decoctl import Generator, load_model
from decoctl.model._image_processor import MAX_IMAGES, MAX_PIXELS

from .conftest import API_KEY, Live, openai, plugin_registry, start_server
from .test_refusals import post, refused

vlm = pytest.importorskip("decoctl.testing.vlm")
#: LLaVA's style: transformers' {"type": "image"} parts become the image token
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m.role | upper }}: {% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}{% if p.type == 'image' %}<image>\\n{% else %}{{ p.text }}{% endif %}"
    "{% endfor %}{% endif %}\\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
NAME = "tiny-llava"


@attrs.frozen
class VisionLive:
    url: str
    folder: Path
    picture: bytes


@pytest.fixture(scope="module")
def vision_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VisionLive]:
    from PIL import Image

    from decoctl.generation import ChatTemplate
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    if vlm.missing():
        pytest.skip(f"the vision-language export needs {', '.join(vlm.missing())}")
    root = tmp_path_factory.mktemp("serve-llava")
    folder = vlm.build_llava(root).onnx
    (folder / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    png = root / "picture.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (30, 30, 3), dtype=np.uint8)).save(png)
    engine = Engine({"target": load_model(folder, name=NAME)}, registry=plugin_registry(), max_rows=2)
    app = create_app(engine, model_name=NAME, chat_template=ChatTemplate.from_folder(folder), api_key=API_KEY)
    url, thread, server = start_server(app)
    yield VisionLive(url=url, folder=folder, picture=png.read_bytes())
    server.should_exit = True
    thread.join()
    shutil.rmtree(root, ignore_errors=True)


def image_message(picture: bytes, text: str = "what is in the picture?") -> dict[str, object]:
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}],
    }


def test_an_image_url_part_gives_the_offline_generators_answer(vision_live: VisionLive) -> None:
    client = openai.OpenAI(base_url=f"{vision_live.url}/v1", api_key=API_KEY, max_retries=0)

    answer = client.chat.completions.create(
        model=NAME, messages=[image_message(vision_live.picture)], temperature=0, max_tokens=12
    )

    offline = Generator({"target": vision_live.folder}, "greedy", registry=plugin_registry(), threads=1)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is in the picture?"}]}]
    expected = offline.generate(offline.chat_prompt(messages), images=[vision_live.picture], max_new_tokens=12)
    assert answer.choices[0].message.content == expected.text


def test_an_image_url_that_is_not_a_data_url_is_a_400(vision_live: VisionLive) -> None:
    body = {
        "model": NAME,
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}
        ],
    }

    status, message = refused(
        Live(url=vision_live.url, folder=vision_live.folder, registry=None, engine=None),
        body,
        path="/v1/chat/completions",
    )  # type: ignore[arg-type]

    assert status == 400 and "data: URLs only" in message and "fetches nothing" in message


def test_data_that_is_not_an_image_is_a_400_naming_it(vision_live: VisionLive) -> None:
    body = {"model": NAME, "messages": [image_message(b"plain text, no picture")]}

    status, answer, _ = post(vision_live.url + "/v1/chat/completions", body)

    assert status == 400 and "is not an image" in answer["error"]["message"]


def png_header(width: int, height: int) -> bytes:
    """A PNG that says it is ``width`` x ``height`` (greyscale) and holds no pixel data: what a decompression bomb
    looks like before it is decoded, in a few bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_an_image_over_the_pixel_limit_is_a_400_naming_the_limit_before_it_is_decoded(vision_live: VisionLive) -> None:
    body = {"model": NAME, "messages": [image_message(png_header(10_000, 6_000))]}

    status, answer, _ = post(vision_live.url + "/v1/chat/completions", body)

    message = answer["error"]["message"]
    assert status == 400 and "10000x6000" in message and f"limit of {MAX_PIXELS:,}" in message


def test_a_decompression_bomb_is_a_400_not_a_500(vision_live: VisionLive) -> None:
    body = {"model": NAME, "messages": [image_message(png_header(15_000, 15_000))]}  # 218 KB as a real PNG

    status, answer, _ = post(vision_live.url + "/v1/chat/completions", body)

    assert status == 400 and "too large" in answer["error"]["message"]


def test_more_images_than_the_limit_is_a_400_naming_it(vision_live: VisionLive) -> None:
    message = image_message(vision_live.picture)
    parts = message["content"] * (MAX_IMAGES + 1)  # type: ignore[operator]
    body = {"model": NAME, "messages": [{"role": "user", "content": parts}]}

    status, answer, _ = post(vision_live.url + "/v1/chat/completions", body)

    assert status == 400 and f"limit of {MAX_IMAGES}" in answer["error"]["message"]
    assert "--max-images" in answer["error"]["message"]


def test_an_image_for_a_text_only_model_is_a_400(live: Live) -> None:
    body = {"model": "tiny", "messages": [image_message(b"\x89PNG")]}

    status, message = refused(live, body, path="/v1/chat/completions")

    assert status == 400 and "has no vision encoder" in message

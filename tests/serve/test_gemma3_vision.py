"""Gemma 3 behind the server: an image_url part becomes the begin-of-image mark in the chat template, the server
expands it in the rendered text as Gemma3Processor does, and the answer equals the offline Generator's on the same
messages and image."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import pytest

from decoctl import Generator, load_model

from .conftest import API_KEY, openai, plugin_registry, start_server

vlm_gemma3 = pytest.importorskip("decoctl.testing.vlm_gemma3")
#: Gemma 3's style: transformers' {"type": "image"} parts become the begin-of-image mark
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}<start_of_image>{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}\\n"
    "{% endfor %}{% if add_generation_prompt %}<model>{% endif %}"
)
NAME = "tiny-gemma3"


@attrs.frozen
class GemmaLive:
    url: str
    folder: Path
    picture: bytes


@pytest.fixture(scope="module")
def gemma_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GemmaLive]:
    from PIL import Image

    from decoctl.generation import ChatTemplate
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    if vlm_gemma3.missing():
        pytest.skip(f"the vision-language export needs {', '.join(vlm_gemma3.missing())}")
    root = tmp_path_factory.mktemp("serve-gemma3")
    folder = vlm_gemma3.build_gemma3(root).onnx
    (folder / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    png = root / "picture.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (41, 30, 3), dtype=np.uint8)).save(png)
    engine = Engine({"target": load_model(folder, name=NAME)}, registry=plugin_registry(), max_rows=2)
    app = create_app(engine, model_name=NAME, chat_template=ChatTemplate.from_folder(folder), api_key=API_KEY)
    url, thread, server = start_server(app)
    yield GemmaLive(url=url, folder=folder, picture=png.read_bytes())
    server.should_exit = True
    thread.join()
    shutil.rmtree(root, ignore_errors=True)


def test_an_image_url_part_gives_the_offline_generators_answer(gemma_live: GemmaLive) -> None:
    client = openai.OpenAI(base_url=f"{gemma_live.url}/v1", api_key=API_KEY, max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(gemma_live.picture).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": " what is in it?"}]

    answer = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": content}], temperature=0, max_tokens=12
    )

    offline = Generator({"target": gemma_live.folder}, "greedy", registry=plugin_registry(), threads=1)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " what is in it?"}]}]
    expected = offline.generate(offline.chat_prompt(messages), images=[gemma_live.picture], max_new_tokens=12)
    assert answer.choices[0].message.content == expected.text
    assert expected.tokens  # an answer, not an empty string on both sides


def test_two_images_at_once_each_give_their_offline_answer(gemma_live: GemmaLive) -> None:
    """Two requests' rows prefill and decode beside each other in the engine's batched buffer."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    other = Path(gemma_live.folder).parent / "other.png"
    Image.fromarray(np.random.default_rng(4).integers(0, 255, (20, 70, 3), dtype=np.uint8)).save(other)
    pictures = [gemma_live.picture, other.read_bytes()]
    client = openai.OpenAI(base_url=f"{gemma_live.url}/v1", api_key=API_KEY, max_retries=0)

    def ask(picture: bytes) -> str:
        url = "data:image/png;base64," + base64.b64encode(picture).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": " and this?"}]
        answer = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": content}], temperature=0, max_tokens=12
        )
        return str(answer.choices[0].message.content)

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(ask, pictures))

    offline = Generator({"target": gemma_live.folder}, "greedy", registry=plugin_registry(), threads=1)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " and this?"}]}]
    expected = [
        offline.generate(offline.chat_prompt(messages), images=[picture], max_new_tokens=12).text
        for picture in pictures
    ]
    assert answers == expected
    assert expected[0] != expected[1]

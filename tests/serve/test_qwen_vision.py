"""A dynamic-resolution vision-language model (a tiny Qwen2.5-VL) behind the server: chat messages with images of
different sizes, sent together so that their rows (each with its own rotary delta) decode in the same batched steps,
each get the offline Generator's answer."""

from __future__ import annotations

import base64
import io
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from decoctl import Generator, load_model

from .conftest import API_KEY, openai, plugin_registry, start_server

vlm_qwen = pytest.importorskip("decoctl.testing.vlm_qwen")
#: Qwen's style: transformers' {"type": "image"} parts become the vision marks around one image pad
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m.role | upper }}: {% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}{% if p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}\\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
NAME = "tiny-qwen-vl"
#: (width, height): each gives another grid, so another rope delta
SIZES = [(200, 90), (90, 200), (30, 41), (300, 300)]


@attrs.frozen
class QwenLive:
    url: str
    folder: Path
    pictures: tuple[bytes, ...]


@pytest.fixture(scope="module")
def qwen_live(
    tmp_path_factory: pytest.TempPathFactory, built_once: Callable[[str, Callable[[Path], Any]], Any]
) -> Iterator[QwenLive]:
    from PIL import Image

    from decoctl.generation import ChatTemplate
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    if vlm_qwen.missing():
        pytest.skip(f"the vision-language export needs {', '.join(vlm_qwen.missing())}")
    root = tmp_path_factory.mktemp("serve-qwen-vl")
    folder = root / "onnx"  # a copy of the export the composite tests share, with a chat template added
    shutil.copytree(built_once("qwen_vl", vlm_qwen.build_qwen_vl).onnx, folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    pictures = []
    for seed, (width, height) in enumerate(SIZES):
        buffer = io.BytesIO()
        pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buffer, "PNG")
        pictures.append(buffer.getvalue())
    engine = Engine({"target": load_model(folder, name=NAME)}, registry=plugin_registry(), max_rows=len(SIZES))
    app = create_app(engine, model_name=NAME, chat_template=ChatTemplate.from_folder(folder), api_key=API_KEY)
    url, thread, server = start_server(app)
    yield QwenLive(url=url, folder=folder, pictures=tuple(pictures))
    server.should_exit = True
    thread.join()
    shutil.rmtree(root, ignore_errors=True)


def image_message(picture: bytes, text: str = "what is in the picture?") -> dict[str, object]:
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}],
    }


def test_images_of_every_size_sent_together_each_get_the_offline_answer(qwen_live: QwenLive) -> None:
    client = openai.OpenAI(base_url=f"{qwen_live.url}/v1", api_key=API_KEY, max_retries=0)

    def ask(picture: bytes) -> str | None:
        answer = client.chat.completions.create(
            model=NAME, messages=[image_message(picture)], temperature=0, max_tokens=16
        )
        return answer.choices[0].message.content

    with ThreadPoolExecutor(len(qwen_live.pictures)) as pool:
        answers = list(pool.map(ask, qwen_live.pictures))

    offline = Generator({"target": qwen_live.folder}, "greedy", registry=plugin_registry(), threads=1)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is in the picture?"}]}]
    expected = [
        offline.generate(offline.chat_prompt(messages), images=[picture], max_new_tokens=16).text
        for picture in qwen_live.pictures
    ]
    assert answers == expected
    assert len(set(expected)) > 1  # the images change the answer

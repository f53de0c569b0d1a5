"""The prefix cache on vision-language models (LLaVA, Gemma 3 with its image tokens attending both ways, Qwen2.5-VL
with M-RoPE): a prompt's image tokens are the same ids whatever the image, so a prompt with another image copies
only the blocks before its first image token, a prompt with the same image copies past it, and every answer equals
the answer without the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import Generator
from decoctl.generation._prefix_cache import BLOCK_TOKENS
from decoctl.plugins import PluginRegistry

NEW = 12
#: text before the image: a few whole blocks with any of the test tokenizers, the image well inside the tiny Gemma 3's
#: ring caches (the prefix cache reuses a ring-cache model's prefix only as far as its rings hold it)
LEAD = "USER: look at this picture closely and say what it shows, in one short line of text please. "
#: text after it: more than a block, so that a longer prompt shares whole blocks past the image
TAIL = " Describe it in detail: its colours, its shapes, its edges and what it might be a picture of. ASSISTANT:"


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from PIL import Image

    folder = tmp_path_factory.mktemp("prefix-images")
    paths = []
    for seed in (1, 2):
        path = folder / f"{seed}.png"
        Image.fromarray(np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def _family(request: pytest.FixtureRequest, name: str) -> tuple[Path, str]:
    if name == "llava":
        from vlm_models import IMAGE_MARK

        return request.getfixturevalue("llava").onnx, IMAGE_MARK
    if name == "gemma3":
        import gemma3_models

        built = request.getfixturevalue("built_once")("gemma3", gemma3_models.gemma3)
        return built.onnx, gemma3_models.IMAGE_MARK
    from qwen_vl_models import IMAGE_MARK

    return request.getfixturevalue("qwen_vl").onnx, IMAGE_MARK


@pytest.mark.parametrize("family", ["llava", "gemma3", "qwen_vl"])
def test_a_prompt_copies_past_its_image_only_where_the_image_is_the_same(
    family: str, request: pytest.FixtureRequest, pictures: list[Path]
) -> None:
    folder, mark = _family(request, family)
    registry = PluginRegistry(autoload=False)
    off = Generator({"target": folder}, registry=registry, threads=1)
    on = Generator({"target": off.models["target"]}, registry=registry, threads=1, prefix_cache_mb=16)
    prompt = f"{LEAD}{mark}{TAIL}"
    runs: list[tuple[str, list[Path]]] = [
        (prompt, [pictures[0]]),
        (prompt, [pictures[1]]),  # the same tokens, another image: only the blocks before the image
        (prompt + " and its colours?", [pictures[0]]),  # the first image again: past it
    ]
    saved = []
    for text, images in runs:
        before = _saved(on)
        assert on.generate(text, images=images, max_new_tokens=NEW).tokens == (
            off.generate(text, images=images, max_new_tokens=NEW).tokens
        )
        saved.append(_saved(on) - before)
    target = on.models["target"]
    assert target.vision is not None
    ids = on._request(prompt, NEW, (), 0, [pictures[0]]).ids  # the prompt as the decoder takes it, image expanded
    first_image = int(np.flatnonzero(ids == target.vision.embedder.image_token)[0])
    assert first_image >= 2 * BLOCK_TOKENS
    assert saved[0] == 0
    assert 0 < saved[1] <= first_image  # never an image token's KV from the other image
    assert saved[2] > first_image  # the same image: its KV copied too


def _saved(generator: Any) -> int:
    return int(generator.prefix_cache.stats().tokens_saved)


def test_the_servers_rows_copy_past_an_image_only_for_the_same_image(llava: Any, pictures: list[Path]) -> None:
    import queue

    from vlm_models import IMAGE_MARK

    from decoctl import load_model
    from decoctl.serve._engine import Engine, EngineRequest, Finished

    registry = PluginRegistry(autoload=False)
    engine = Engine({"target": load_model(llava.onnx)}, registry=registry, max_rows=2, prefix_cache_mb=16)
    offline = Generator({"target": engine.models["target"]}, registry=registry, threads=1)
    prompt = f"{LEAD}{IMAGE_MARK}{TAIL}"
    engine.start()
    try:
        for images in ([pictures[0]], [pictures[1]], [pictures[0]]):
            request = offline._request(prompt, NEW, (), 0, images)  # the ids and features the app would make
            events: queue.Queue[Any] = queue.Queue()
            engine.submit(EngineRequest(ids=tuple(request.ids), images=request.images, max_new_tokens=NEW), events.put)
            finished = events.get(timeout=120)
            while not isinstance(finished, Finished):
                finished = events.get(timeout=120)
            assert finished.tokens == offline.generate(prompt, images=images, max_new_tokens=NEW).tokens
    finally:
        engine.close(drain=False)
    assert engine.prefix_cache is not None and engine.prefix_cache.stats().hits == 2


def test_the_same_images_run_the_vision_encoder_once(llava: Any, pictures: list[Path]) -> None:
    from vlm_models import IMAGE_MARK

    registry = PluginRegistry(autoload=False)
    off = Generator({"target": llava.onnx}, registry=registry, threads=1)
    on = Generator({"target": llava.onnx}, registry=registry, threads=1, prefix_cache_mb=16)
    vision = on.models["target"].vision
    assert vision is not None
    prompt = f"{LEAD}{IMAGE_MARK}{TAIL}"
    runs = []
    for images in ([pictures[0]], [pictures[0].read_bytes()], [pictures[1]], [pictures[0]]):
        before = vision.encoder_runs
        result = on.generate(prompt, images=images, max_new_tokens=NEW)
        assert result.tokens == off.generate(prompt, images=images, max_new_tokens=NEW).tokens
        runs.append(vision.encoder_runs - before)
    # a path and the same file's bytes are the same image; another image runs the encoder, the first is still kept
    assert runs == [1, 0, 1, 0]
    assert on.prefix_cache is not None and on.prefix_cache.stats().image_hits == 2


def test_a_chat_about_a_picture_through_the_server_runs_the_encoder_once(
    llava: Any, pictures: list[Path], tmp_path: Path
) -> None:
    import base64
    import socket
    import threading

    openai = pytest.importorskip("openai")
    uvicorn = pytest.importorskip("uvicorn")
    from decoctl import load_model
    from decoctl.generation import ChatTemplate
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    folder = llava.onnx
    template = tmp_path / "chat_template.jinja"
    template.write_text(
        "{{ bos_token }}{% for m in messages %}{{ m.role | upper }}: {% if m.content is string %}{{ m.content }}"
        "{% else %}{% for p in m.content %}{% if p.type == 'image' %}<image>\\n{% else %}{{ p.text }}{% endif %}"
        "{% endfor %}{% endif %}\\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    )
    registry = PluginRegistry(autoload=False)
    engine = Engine({"target": load_model(folder, name="llava")}, registry=registry, max_rows=2, prefix_cache_mb=16)
    chat = ChatTemplate.from_folder(folder, template=template)
    app = create_app(engine, model_name="llava", chat_template=chat, api_key=None)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    vision = engine.models["target"].vision
    assert vision is not None
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="x", max_retries=0)
        url = "data:image/png;base64," + base64.b64encode(pictures[0].read_bytes()).decode()
        picture = {"type": "image_url", "image_url": {"url": url}}
        messages: list[dict[str, Any]] = [{"role": "user", "content": [picture, {"type": "text", "text": LEAD}]}]
        runs = []
        for turn in ("what is it?", "and its colours?"):
            messages.append({"role": "user", "content": turn})
            before = vision.encoder_runs
            answer = client.chat.completions.create(model="llava", messages=messages, max_tokens=8, temperature=0)
            runs.append(vision.encoder_runs - before)
            messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    finally:
        server.should_exit = True
        thread.join()
    assert runs == [1, 0]  # the second turn carries the same picture: its features were kept
    assert engine.prefix_cache is not None
    stats = engine.prefix_cache.stats()
    assert stats.image_hits == 1 and stats.hits == 1  # and the second turn copied the first turn's blocks

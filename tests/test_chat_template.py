"""Chat templates render and tokenize as transformers' apply_chat_template does (decoctl.generation).

Five public template families are written here as data, each in a tokenizer folder built from the test tokenizer
with that family's special tokens (and, where the family's real tokenizer adds BOS itself, a post-processor that
does, so that a second BOS would show).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, processors

from decoctl import ConfigError, Generator
from decoctl.generation import ChatPrompt, ChatTemplate
from decoctl.testing import build_genai_model
from decoctl.testing._tokenizer import build_tokenizer

transformers = pytest.importorskip("transformers")

QWEN = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n'
    "    {{- \"\\n</tools><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

LLAMA3 = (
    "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- if strftime_now is defined %}\n"
    '        {%- set date_string = strftime_now("%d %b %Y") %}\n    {%- else %}\n'
    '        {%- set date_string = "26 Jul 2024" %}\n    {%- endif %}\n{%- endif %}\n'
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n{%- else %}\n"
    '    {%- set system_message = "" %}\n{%- endif %}\n'
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n'
    '{{- "Cutting Knowledge Date: December 2023\\n" }}\n{{- "Today Date: " + date_string + "\\n\\n" }}\n'
    '{{- system_message }}\n{{- "<|eot_id|>" }}\n{%- for message in messages %}\n'
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n"
)

GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

#: family -> (template, special tokens (bos, eos), added tokens, whether its tokenizer adds BOS, system messages)
FAMILIES = {
    "qwen": (QWEN, (None, "<|im_end|>"), ["<|im_start|>", "<|im_end|>", "<|endoftext|>"], False, True),
    "llama3": (
        LLAMA3,
        ("<|begin_of_text|>", "<|eot_id|>"),
        ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
        True,
        True,
    ),
    "gemma": (GEMMA, ("<bos>", "<eos>"), ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], True, False),
    "phi3": (
        PHI3,
        ("<s>", "<|endoftext|>"),
        ["<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        False,
        True,
    ),
    "mistral": (MISTRAL, ("<s>", "</s>"), ["<s>", "</s>"], True, False),
}

USER = 'Write <b>"café"</b> & 日本語 🐍 in a function:\n  def f(x):'
CHAT = [
    {"role": "user", "content": USER},
    {"role": "assistant", "content": "  return x * 2  "},
    {"role": "user", "content": "And for lists?"},
]
SYSTEM = {"role": "system", "content": "You are terse. Use <code> tags & no HTML escaping."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather at a place <city> & date",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def write_family(folder: Path, family: str, *, template_in_config: bool) -> Path:
    """A tokenizer folder for ``family``: tokenizer.json with its special tokens, tokenizer_config.json naming them,
    and the template in chat_template.jinja or in tokenizer_config.json."""
    template, (bos, eos), added, adds_bos, _ = FAMILIES[family]
    tokenizer = Tokenizer.from_file(str(build_tokenizer(folder)))
    tokenizer.add_special_tokens(added)
    if adds_bos:  # as Llama 3's, Gemma's and Mistral's tokenizer.json do: BOS from the post-processor
        bos_id = tokenizer.token_to_id(bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": {"content": eos, "special": True, "__type": "AddedToken"},
        "pad_token": eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    if template_in_config:
        config["chat_template"] = template
    else:
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture(params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    in_config = request.param in ("qwen", "gemma")  # the others from chat_template.jinja
    return request.param, write_family(tmp_path, request.param, template_in_config=in_config)


def hf_ids(folder: Path, messages: list[dict[str, str]], **kwargs: object) -> list[int]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    return list(encoded)


def chat_for(family: str) -> list[dict[str, str]]:
    return [SYSTEM, *CHAT] if FAMILIES[family][4] else list(CHAT)


def test_token_ids_equal_transformers_with_the_generation_prompt(family: tuple[str, Path]) -> None:
    name, folder = family
    messages = chat_for(name)
    ours = ChatTemplate.from_folder(folder).encode(messages, add_generation_prompt=True)
    assert ours == hf_ids(folder, messages, add_generation_prompt=True)


def test_token_ids_equal_transformers_without_the_generation_prompt(family: tuple[str, Path]) -> None:
    name, folder = family
    messages = chat_for(name)
    ours = ChatTemplate.from_folder(folder).encode(messages, add_generation_prompt=False)
    assert ours == hf_ids(folder, messages, add_generation_prompt=False)


def test_rendered_text_equals_transformers(family: tuple[str, Path]) -> None:
    name, folder = family
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    messages = chat_for(name)
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ChatTemplate.from_folder(folder).render(messages) == expected


def test_the_templated_text_gets_one_bos_where_the_tokenizer_would_add_another(tmp_path: Path) -> None:
    folder = write_family(tmp_path, "llama3", template_in_config=False)
    template = ChatTemplate.from_folder(folder)
    bos = template.tokenizer.token_to_id("<|begin_of_text|>")
    prompt = template.prompt(CHAT)
    assert prompt.ids.count(bos) == 1 and prompt.ids[0] == bos
    # what encoding the text with the tokenizer's special tokens would have given: two
    assert template.tokenizer.encode(str(prompt)).ids[:2] == [bos, bos]


def test_tojson_keeps_html_characters_and_tools_render_as_transformers(tmp_path: Path) -> None:
    folder = write_family(tmp_path, "qwen", template_in_config=True)
    template = ChatTemplate.from_folder(folder)
    text = template.render(CHAT, tools=TOOLS)
    assert '"Weather at a place <city> & date"' in text
    assert template.encode(CHAT, tools=TOOLS) == hf_ids(folder, CHAT, tools=TOOLS, add_generation_prompt=True)


def test_raise_exception_in_a_template_is_a_config_error_with_its_message(tmp_path: Path) -> None:
    template = ChatTemplate.from_folder(write_family(tmp_path, "gemma", template_in_config=True))
    with pytest.raises(ConfigError, match="System role not supported"):
        template.render([SYSTEM, *CHAT])


def test_the_sandbox_refuses_reaching_python_internals(tmp_path: Path) -> None:
    escape = tmp_path / "escape.jinja"
    escape.write_text("{{ messages.__class__.__mro__[1].__subclasses__() }}", encoding="utf-8")
    template = ChatTemplate.from_folder(write_family(tmp_path, "phi3", template_in_config=False), template=escape)
    with pytest.raises(ConfigError, match="sandbox"):
        template.render(CHAT)


def test_a_given_template_file_takes_precedence_over_the_folders(tmp_path: Path) -> None:
    folder = write_family(tmp_path / "model", "phi3", template_in_config=False)
    given = tmp_path / "mine.jinja"
    given.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}", encoding="utf-8")
    assert ChatTemplate.from_folder(folder, template=given).render(CHAT[:1]) == f"[user]{USER}"


def test_a_folder_without_a_template_names_the_files_and_the_fix(tmp_path: Path) -> None:
    build_tokenizer(tmp_path)
    with pytest.raises(ConfigError, match=r"chat_template\.jinja.*--chat-template"):
        ChatTemplate.from_folder(tmp_path)


def test_invalid_jinja_is_refused_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content ", encoding="utf-8")
    build_tokenizer(tmp_path)
    with pytest.raises(ConfigError, match="not valid Jinja"):
        ChatTemplate.from_folder(tmp_path, template=bad)


def test_generator_chat_generates_from_the_templated_ids(tmp_path: Path) -> None:
    model = build_genai_model(tmp_path / "model", seed=7)
    (model / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}",
        encoding="utf-8",
    )
    generator = Generator({"target": str(model)}, "greedy")
    prompt = generator.chat_prompt(CHAT)
    assert isinstance(prompt, ChatPrompt)
    assert prompt.ids == tuple(ChatTemplate.from_folder(model).encode(CHAT))
    result = generator.chat(CHAT, max_new_tokens=8)
    again = generator.generate(prompt, max_new_tokens=8)
    assert result.tokens == again.tokens
    assert result.stats.prompt_tokens == len(prompt.ids)

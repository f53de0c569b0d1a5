"""Chat templates rendered as transformers renders them, and the rendered text tokenized as transformers does.

template = ChatTemplate.from_folder("path/to/model")          # chat_template.jinja, else tokenizer_config.json's
ids = template.encode([{"role": "user", "content": "Hi"}])      # == tokenizer.apply_chat_template(..., tokenize=True)
result = generator.chat([{"role": "user", "content": "Hi"}])    # Generator.chat renders through this module

The template is a Jinja program from the Hub, so it runs in jinja2's ImmutableSandboxedEnvironment with exactly
what transformers gives it (``trim_blocks``, ``lstrip_blocks``, the loop-controls extension, ``raise_exception``,
``strftime_now``, ``tojson`` without HTML escaping, a ``dict`` and a ``namespace`` that refuse underscore names) and
the tokenizer's named special tokens (``bos_token``, ``eos_token``, ...) as variables. The rendered text already holds
every special token the model expects (a template that wants BOS writes ``{{ bos_token }}``), so it is tokenized
without adding special tokens again: no double BOS.

jinja2 comes with the ``chat`` extra (``pip install 'decoctl[chat]'``; the ``serve`` extra includes it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import attrs
from tokenizers import Tokenizer as HfTokenizer

from decoctl.errors import ConfigError, ModelLoadError

__all__ = ["CHAT_TEMPLATE_FILE", "SPECIAL_TOKEN_NAMES", "ChatPrompt", "ChatTemplate", "encode_prompt"]

CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""The file transformers (>= 4.43) saves a tokenizer's chat template in, next to tokenizer_config.json."""
#: the named special tokens transformers passes to a template (its SPECIAL_TOKENS_ATTRIBUTES)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: transformers refuses templates under jinja2 3.1.6: older versions have known sandbox escapes
MIN_JINJA = (3, 1, 6)


class ChatPrompt(str):
    """A rendered chat as text (what hooks and errors show) with the token ids it is generated from (``ids``):
    the Generator feeds the ids as they are instead of encoding the text again with the tokenizer's special
    tokens."""

    ids: tuple[int, ...]

    def __new__(cls, text: str, ids: Sequence[int]) -> ChatPrompt:
        prompt = super().__new__(cls, text)
        prompt.ids = tuple(int(i) for i in ids)
        return prompt


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """A prompt's token ids: a ChatPrompt's own, else the tokenizer's encoding with its special tokens (BOS)."""
    if isinstance(prompt, ChatPrompt):
        return list(prompt.ids)
    ids: list[int] = tokenizer.encode(prompt)
    return ids


def _jinja() -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise ConfigError(
            "chat templates need jinja2: pip install 'decoctl[chat]' (or 'decoctl[serve]', which includes it)"
        ) from None
    version = tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())
    if version < MIN_JINJA:
        raise ConfigError(
            f"jinja2 {jinja2.__version__} has known sandbox escapes and chat templates are code from the Hub: "
            "pip install -U 'jinja2>=3.1.6'"
        )
    return jinja2


def _environment() -> Any:
    """A sandbox with what transformers' apply_chat_template gives a template (utils/chat_template_utils.py)."""
    jinja2 = _jinja()

    extension, namespace = jinja2.ext.Extension, jinja2.utils.Namespace

    class Generation(extension):  # type: ignore[valid-type,misc]
        """``{% generation %}...{% endgeneration %}`` (assistant-mask markers for training): renders its body."""

        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            text: str = caller()
            return text

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        # jinja2's own tojson escapes HTML characters, which a prompt must keep as they are
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        # a dict constructor without the class itself: no attribute access to break out through
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(namespace):  # type: ignore[valid-type,misc]
        # a namespace that refuses underscore names, which lead to CPython's internals
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            for name in dict(*rest, **kwargs):
                TemplateNamespace._check(name)
            namespace.__init__(self, *rest, **kwargs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check(name)
            namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template may not store the attribute {name!r}")

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = TemplateDict()
    environment.globals["namespace"] = TemplateNamespace
    return environment


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types (what a template may see), keys whose value is None dropped from
    each message as transformers drops them."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    raise ConfigError(f"a chat message holds a {type(value).__name__}: give strings, numbers, lists and objects only")


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise ConfigError('a chat is a non-empty list of messages such as {"role": "user", "content": "..."}')
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ConfigError(f'message {index} must be an object with a "role" string (and its "content")')
        checked.append({key: _plain(value) for key, value in message.items() if value is not None})
    return checked


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} could not be read as JSON ({exc}): fix or remove it") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} holds {type(data).__name__}, not a JSON object: fix or remove it")
    return data


def _configured_template(config: Mapping[str, Any], path: Path) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of named ones (the "default" one is used)."""
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, Mapping)}
        if isinstance(named.get("default"), str):
            return str(named["default"])
        raise ConfigError(
            f"{path} lists chat templates {sorted(map(str, named))} but none named 'default': give one with "
            "--chat-template FILE"
        )
    raise ModelLoadError(f"{path}: chat_template is a {type(value).__name__}, not a template string: fix it")


@attrs.frozen(kw_only=True)
class ChatTemplate:
    """A model's chat template (``source``, read from ``origin``), the named special tokens it sees, and the
    tokenizer that encodes what it renders."""

    source: str
    origin: str
    special_tokens: Mapping[str, str] = attrs.field(factory=dict)
    tokenizer: HfTokenizer = attrs.field(eq=False, repr=False)
    _compiled: Any = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        jinja2 = _jinja()
        try:
            compiled = _environment().from_string(self.source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ConfigError(
                f"the chat template from {self.origin} is not valid Jinja (line {exc.lineno}: {exc.message}): fix it"
            ) from None
        object.__setattr__(self, "_compiled", compiled)

    @classmethod
    def from_folder(cls, folder: str | Path, *, template: str | Path | None = None) -> ChatTemplate:
        """The template of the model (or tokenizer) folder ``folder``: ``template`` (a file) when given, else the
        folder's chat_template.jinja, else tokenizer_config.json's chat_template. ConfigError naming the files
        looked at when there is none."""
        folder = Path(folder)
        config_path = folder / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        if template is not None:
            path = Path(template)
            try:
                source, origin = path.read_text(encoding="utf-8"), str(path)
            except OSError as exc:
                raise ConfigError(
                    f"--chat-template {path}: cannot read it ({exc.strerror}): give a readable file"
                ) from None
        elif (folder / CHAT_TEMPLATE_FILE).is_file():
            source, origin = (folder / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8"), str(folder / CHAT_TEMPLATE_FILE)
        else:
            configured = _configured_template(config, config_path)
            if configured is None:
                raise ConfigError(
                    f"model folder {folder} has no chat template (neither {CHAT_TEMPLATE_FILE} nor a chat_template in "
                    "tokenizer_config.json): it may be a base model that only continues text; give a template with "
                    "--chat-template FILE (Python: ChatTemplate.from_folder(folder, template=FILE))"
                )
            source, origin = configured, str(config_path)
        tokenizer_path = folder / "tokenizer.json"
        try:
            tokenizer = HfTokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # tokenizers raises plain Exception subclasses for every failure
            raise ModelLoadError(f"{tokenizer_path} could not be read ({exc}): save the tokenizer there") from exc
        return cls(source=source, origin=origin, special_tokens=_special_tokens(folder, config), tokenizer=tokenizer)

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        """The chat as text: ``messages`` (dicts with "role" and "content") through the template with
        ``add_generation_prompt`` (the assistant's header after the last message), the special tokens and
        ``variables`` (tools, documents or a template's own switches, as apply_chat_template's keyword arguments).
        ConfigError for a chat the template refuses (its raise_exception message) or cannot render."""
        jinja2 = _jinja()
        context = {**self.special_tokens, **{k: _plain(v) for k, v in variables.items()}}
        context.setdefault("tools", None)
        context.setdefault("documents", None)
        try:
            text: str = self._compiled.render(
                messages=_messages(messages), add_generation_prompt=add_generation_prompt, **context
            )
        except jinja2.exceptions.SecurityError as exc:
            raise ConfigError(
                f"the chat template from {self.origin} tried something the sandbox forbids: {exc}"
            ) from None
        except jinja2.exceptions.TemplateError as exc:
            raise ConfigError(f"the chat template from {self.origin} refused this chat: {exc}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ConfigError(
                f"the chat template from {self.origin} failed on this chat ({type(exc).__name__}: {exc}): check the "
                "messages' roles and contents"
            ) from None
        return text

    def encode(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **variables: Any
    ) -> list[int]:
        """The rendered chat's token ids, without adding special tokens again (the template wrote them)."""
        return list(self.prompt(messages, add_generation_prompt=add_generation_prompt, **variables).ids)

    def prompt(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **variables: Any
    ) -> ChatPrompt:
        """The rendered chat with its token ids, as a ChatPrompt a Generator takes for a prompt."""
        text = self.render(messages, add_generation_prompt=add_generation_prompt, **variables)
        return ChatPrompt(text, self.tokenizer.encode(text, add_special_tokens=False).ids)


def _special_tokens(folder: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """The named special tokens as transformers' special_tokens_map has them: tokenizer_config.json's, then
    special_tokens_map.json's for the names it lacks."""
    tokens = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = _token_text(config.get(name))
        if text is not None:
            tokens[name] = text
    extra = folder / "special_tokens_map.json"
    if extra.is_file():
        for name, value in _read_json(extra).items():
            text = _token_text(value)
            if name in SPECIAL_TOKEN_NAMES and text is not None:
                tokens.setdefault(name, text)
    return tokens

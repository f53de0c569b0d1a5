"""Token-id option values: written on a command line (no commas, they separate processors) or in a run file.

suppress_tokens = "13 42"           token ids, separated by spaces or semicolons
bad_words       = "5 6 7 | 9"       sequences separated by '|', tokens by spaces
logit_bias      = "13:-5 42:2.5"    TOKEN:BIAS pairs
sequence_bias   = "5 6:-2 | 9:1.5"  TOKENS:BIAS items separated by '|'
breakers        = "\\n|:"           texts separated by '|', with backslash escapes (\\n, \\t, \\|)
a JSON or TOML value also works: [13, 42], [[5, 6, 7], [9]], {"13": -5}, [[[5, 6], -2], [[9], 1.5]], ["\\n", ":"]
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from decoctl import ConfigError

__all__ = ["parse_bias", "parse_sequence_bias", "parse_sequences", "parse_structured", "parse_texts", "parse_tokens"]


def parse_structured(text: str) -> Any:
    """A JSON value, or the Python repr of one (what a TOML table becomes after Option's str())."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


def _token(value: Any, owner: str) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError("a boolean")
        token = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{owner}: {value!r} is not a token id (a non-negative integer)") from None
    if token < 0 or token != float(value):
        raise ConfigError(f"{owner}: {value!r} is not a token id (a non-negative integer)")
    return token


def _bias(value: Any, owner: str, what: str) -> float:
    """A bias: a number, or -inf (the token is never produced); nan and +inf would poison the whole row."""
    try:
        if isinstance(value, bool):
            raise TypeError("a boolean")
        amount = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{owner}: bias {value!r} of {what} is not a number") from None
    if math.isnan(amount) or amount == math.inf:
        raise ConfigError(f"{owner}: bias {value!r} of {what} must be a finite number or -inf (never produced)")
    return amount


def _looks_structured(text: str) -> bool:
    return text.startswith(("[", "{"))


def _structured(text: str, owner: str) -> Any:
    try:
        return parse_structured(text)
    except (ValueError, SyntaxError) as exc:
        raise ConfigError(f"{owner}: {text!r} is neither JSON nor a list of token ids ({exc})") from None


def parse_tokens(text: str, owner: str) -> tuple[int, ...]:
    """``"13 42"``, ``"13;42"`` or ``[13, 42]`` -> (13, 42)."""
    text = text.strip()
    if _looks_structured(text):
        value = _structured(text, owner)
        items = value if isinstance(value, list) else [value]
    else:
        items = [t for t in re.split(r"[\s;]+", text) if t]
    return tuple(_token(item, owner) for item in items)


def parse_sequences(text: str, owner: str) -> tuple[tuple[int, ...], ...]:
    """``"5 6 7 | 9"`` or ``[[5, 6, 7], [9]]`` -> ((5, 6, 7), (9,)); every sequence non-empty."""
    text = text.strip()
    if _looks_structured(text):
        value = _structured(text, owner)
        if not isinstance(value, list) or not all(isinstance(s, list) for s in value):
            raise ConfigError(f"{owner}: {text!r} must be a list of token-id lists, e.g. [[5, 6, 7], [9]]")
        sequences = tuple(tuple(_token(t, owner) for t in s) for s in value)
    else:
        sequences = tuple(tuple(_token(t, owner) for t in part.split()) for part in text.split("|"))
    if not sequences or any(not s for s in sequences):
        raise ConfigError(f"{owner}: {text!r} holds an empty sequence: give token ids like '5 6 7 | 9'")
    return sequences


def parse_bias(text: str, owner: str) -> dict[int, float]:
    """``"13:-5 42:2.5"`` or ``{"13": -5}`` -> {13: -5.0, 42: 2.5}; a repeated token sums its biases."""
    text = text.strip()
    if _looks_structured(text):
        value = _structured(text, owner)
        if not isinstance(value, dict):
            raise ConfigError(f'{owner}: {text!r} must map token ids to biases, e.g. {{"13": -5}}')
        pairs = list(value.items())
    else:
        pairs = []
        for item in (t for t in re.split(r"[\s;]+", text) if t):
            token, sep, bias = item.partition(":")
            if not sep:
                raise ConfigError(f"{owner}: {item!r} must be TOKEN:BIAS, e.g. 13:-5")
            pairs.append((token, bias))
    biases: dict[int, float] = {}
    for token, bias in pairs:
        amount = _bias(bias, owner, f"token {token!r}")
        key = _token(token, owner)
        biases[key] = biases.get(key, 0.0) + amount
    if not biases:
        raise ConfigError(f"{owner}: no TOKEN:BIAS pairs given, e.g. '13:-5 42:2.5'")
    return biases


def parse_sequence_bias(text: str, owner: str) -> tuple[tuple[tuple[int, ...], float], ...]:
    """``"5 6:-2 | 9:1.5"`` or ``[[[5, 6], -2], [[9], 1.5]]`` (transformers' form) -> (((5, 6), -2.0), ((9,), 1.5))."""
    text = text.strip()
    items: list[tuple[Any, Any]] = []
    if _looks_structured(text):
        value = _structured(text, owner)
        if not isinstance(value, list) or not all(isinstance(i, list) and len(i) == 2 for i in value):
            raise ConfigError(f"{owner}: {text!r} must be a list of [token ids, bias] pairs, e.g. [[[5, 6], -2]]")
        items = [(tokens, bias) for tokens, bias in value]
    else:
        for part in (p.strip() for p in text.split("|")):
            tokens, sep, bias = part.rpartition(":")
            if not sep or not tokens.strip():
                raise ConfigError(f"{owner}: {part!r} must be TOKENS:BIAS, e.g. '5 6:-2'")
            items.append((tokens.split(), bias))
    parsed = []
    for tokens, bias in items:
        amount = _bias(bias, owner, f"sequence {tokens!r}")
        sequence = tuple(_token(t, owner) for t in (tokens if isinstance(tokens, list) else [tokens]))
        if not sequence:
            raise ConfigError(f"{owner}: an empty token sequence in {text!r}")
        parsed.append((sequence, amount))
    if not parsed:
        raise ConfigError(f"{owner}: no TOKENS:BIAS items given, e.g. '5 6:-2 | 9:1.5'")
    return tuple(parsed)


def parse_texts(text: str, owner: str) -> tuple[str, ...]:
    """``"\\n|:"`` (backslash escapes decoded) or ``["\\n", ":"]`` -> ("\n", ":"); empty texts are dropped."""
    stripped = text.strip()
    if stripped.startswith("["):
        value = _structured(stripped, owner)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{owner}: {text!r} must be a list of strings")
        return tuple(v for v in value if v)
    parts = re.split(r"(?<!\\)\|", text)
    return tuple(
        decoded
        for decoded in (
            part.replace("\\|", "|").encode("latin-1", "backslashreplace").decode("unicode_escape") for part in parts
        )
        if decoded
    )

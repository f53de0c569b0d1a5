"""A tiny deterministic byte-level BPE tokenizer for tests, trained on a fixed built-in text.

The special tokens sit at fixed ids: ``<|bos|>`` = 0, ``<|eos|>`` = 1, ``<|pad|>`` = 2. The 256 byte tokens
follow, then the merges. The text mixes Python-like code with accented letters, CJK and an emoji, so decoding
exercises multi-byte UTF-8 (a token may hold half a character).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

__all__ = [
    "BOS_TOKEN",
    "BOS_TOKEN_ID",
    "EOS_TOKEN",
    "EOS_TOKEN_ID",
    "PAD_TOKEN",
    "PAD_TOKEN_ID",
    "SPECIAL_TOKENS",
    "TRAINING_TEXT",
    "build_tokenizer",
    "write_tokenizer_config",
]

BOS_TOKEN = "<|bos|>"
"""The testing tokenizer's beginning-of-sequence token."""
EOS_TOKEN = "<|eos|>"
"""The testing tokenizer's end-of-sequence token (the testing models' EOS)."""
PAD_TOKEN = "<|pad|>"
"""The testing tokenizer's padding token."""
BOS_TOKEN_ID = 0
"""The id of BOS_TOKEN."""
EOS_TOKEN_ID = 1
"""The id of EOS_TOKEN."""
PAD_TOKEN_ID = 2
"""The id of PAD_TOKEN."""
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
"""The special tokens, in id order."""

# The smallest vocabulary a byte-level BPE can have: the special tokens and the 256 bytes.
_MIN_VOCAB = len(SPECIAL_TOKENS) + 256

TRAINING_TEXT = '''\
def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    result = []
    a, b = 0, 1
    for _ in range(n):
        result.append(a)
        a, b = b, a + b
    return result


class Stack:
    """A last-in, first-out container."""

    def __init__(self) -> None:
        self._items: list[object] = []

    def push(self, item: object) -> None:
        self._items.append(item)

    def pop(self) -> object:
        if not self._items:
            raise IndexError("pop from an empty stack")
        return self._items.pop()

    def __len__(self) -> int:
        return len(self._items)


def read_lines(path: str, encoding: str = "utf-8") -> list[str]:
    with open(path, encoding=encoding) as handle:
        return [line.rstrip("\\n") for line in handle if line.strip()]


def count_words(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word in text.split():
        counts[word] = counts.get(word, 0) + 1
    return counts


if __name__ == "__main__":
    for value in fibonacci(10):
        print(value, end=" ")
    stack = Stack()
    stack.push("café")
    stack.push("naïve façade")
    print(len(stack), stack.pop())

# Greetings in several languages: the decoder must join bytes back into characters.
greetings = {
    "fr": "Bonjour, ça va ? Très bien, merci ! À bientôt.",
    "de": "Grüße aus München, schöne Straße, Äpfel und Öl.",
    "es": "¿Qué tal? El niño comió piña en la montaña.",
    "pt": "Ação, coração, informação: não há limitação.",
    "zh": "你好，世界。今天天气很好，我们去公园散步吧。",
    "ja": "こんにちは世界。東京の天気は晴れです。",
    "ko": "안녕하세요 세계",
    "emoji": "Ship it 🚀 then celebrate 🎉 with tea ☕ and cake 🍰.",
}


def greet(lang: str) -> str:
    return greetings.get(lang, "hello, world")


def mean(values: list[float]) -> float:
    if not values:
        return 0.0
    return sum(values) / len(values)


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


primes = [n for n in range(100) if is_prime(n)]
squares = {n: n * n for n in range(20)}
total = sum(squares.values())
message = f"{len(primes)} primes, total of squares = {total}"
'''
"""The Python text the testing tokenizer's BPE merges are trained on."""


def build_tokenizer(path_or_dir: str | Path, vocab_size: int = 384) -> Path:
    """Train the test tokenizer and write it as ``tokenizer.json``.

    :param path_or_dir: a folder (the file becomes ``tokenizer.json`` in it, the folder is created) or a
        path ending in ``.json``.
    :param vocab_size: the vocabulary size, at least 262 and at most 849 (beyond that the built-in text has
        no pairs left to merge and the vocabulary stops growing).
    :returns: the path of the written ``tokenizer.json``.
    """
    if vocab_size < _MIN_VOCAB + 3:
        raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE; use at least 262")
    target = Path(path_or_dir)
    if target.suffix != ".json":
        target = target / "tokenizer.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(_train(vocab_size).to_str(pretty=True), encoding="utf-8")
    return target


def write_tokenizer_config(folder: str | Path, *, model_max_length: int) -> Path:
    """Write a Hugging Face style ``tokenizer_config.json`` naming the special tokens.

    :returns: the path of the written file.
    """
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    target = Path(folder) / "tokenizer_config.json"
    target.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return target


def _train(vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE on :data:`TRAINING_TEXT` with the special tokens first."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TRAINING_TEXT.splitlines(keepends=True), trainer=trainer)
    return tokenizer

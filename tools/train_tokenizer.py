"""Train the demo models' byte-level BPE tokenizer (vocab 4096) on build/corpus/train.txt.

Special tokens <|bos|>, <|eos|>, <|pad|> get ids 0, 1, 2. Choices, and why:
- ByteLevel pre-tokenizer with ``add_prefix_space=False`` and ``use_regex=True`` plus the ByteLevel decoder:
  every byte sequence encodes, and ``decode(encode(text)) == text`` exactly (no added leading space, no
  cleanup of spaces around punctuation), which code needs.
- No post-processor: encoding a prompt adds no <|bos|>. The host prepends BOS itself when the model config
  says so (genai_config.json ``bos_token_id``), so the tokenizer never doubles it.
- Training text is split on the eos text, so no merge ever spans two files and ``<|eos|>`` in the corpus
  becomes the single special token id 1.

Usage:  python tools/train_tokenizer.py [--corpus build/corpus/train.txt] [--out tools/artifacts/tokenizer.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]
VOCAB_SIZE = 4096
REPO = Path(__file__).resolve().parent.parent


def build(corpus: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    docs = corpus.read_text(encoding="utf-8").split(SPECIALS[1])
    tok.train_from_iterator((d for d in docs if d), trainer=trainer, length=len(docs))
    return tok


def check(tok: Tokenizer, samples: list[str]) -> None:
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    for s in samples:
        ids = tok.encode(s).ids
        assert tok.decode(ids, skip_special_tokens=False) == s, repr(s[:80])
        assert not ids or ids[0] != 0, "tokenizer must not add <|bos|>"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=REPO / "build" / "corpus" / "train.txt")
    ap.add_argument("--out", type=Path, default=REPO / "tools" / "artifacts" / "tokenizer.json")
    args = ap.parse_args()

    tok = build(args.corpus)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out))
    tok = Tokenizer.from_file(str(args.out))  # check what was saved, not what is in memory
    held = (args.corpus.parent / "heldout.txt").read_text(encoding="utf-8").split(SPECIALS[1])
    check(tok, [" def f(x):\n\treturn x  # é ∑ 🐍\r\n", "def fibonacci(n):", "", "  \n\n  ", *held[:5]])
    text = "".join(held)
    n = len(tok.encode(text).ids)
    print(f"saved {args.out}  vocab={tok.get_vocab_size()}  held-out bytes/token={len(text.encode()) / n:.3f}")


if __name__ == "__main__":
    main()

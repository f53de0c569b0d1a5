"""Diverse prompts cut from text any Linux machine with Python has offline, for a target to continue.

Four kinds, in fixed shares (``SHARES``), each drawn from the sources by one seeded generator, so the same seed on the
same machine gives the same prompts:

- ``code``: a Python module of the interpreter's standard library, up to a ``def`` or ``class`` line and its
  docstring's first line (the target writes the body);
- ``prose``: the start of a paragraph: a docstring of the standard library, a text file under /usr/share/doc (plain
  or gzip) or a manual page under /usr/share/man (gzip, its troff markup stripped);
- ``instruction``: a request built on the same text: write a function a docstring describes, explain a piece of code,
  summarize a paragraph, say what a command does;
- ``edit``: a piece of code or prose to give back changed: a variable renamed, type hints added, a paragraph
  rewritten in simpler words, a list of lines sorted.

Nothing is downloaded; a machine without /usr/share/doc or manual pages cuts its prose from docstrings alone.
"""

from __future__ import annotations

import ast
import gzip
import keyword
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np

from decoctl import ConfigError

__all__ = ["KINDS", "SHARES", "Prompt", "cut_prompts", "sources"]

KINDS = ("code", "prose", "instruction", "edit")
#: the share of each kind among the prompts
SHARES = {"code": 0.3, "prose": 0.3, "instruction": 0.2, "edit": 0.2}
#: the longest prompt, in characters (a few hundred tokens)
MOST_CHARS = 1600
#: files read per source at most (a sample of a large /usr/share is enough)
MOST_FILES = 1500
_SKIPPED_PARTS = {"test", "tests", "idle_test", "site-packages", "lib2to3", "turtledemo", "__pycache__"}
_DEF = re.compile(r"^\s*(?:async\s+def|def|class)\s+\w+")
_TROFF_ESCAPE = re.compile(r"\\f[BIRP]|\\f\(..|\\\(..|\\[&e]|\\s[-+]?\d")


@attrs.frozen(kw_only=True)
class Prompt:
    """One prompt: its ``text``, ``kind`` (one of KINDS) and ``source`` (the file it was cut from)."""

    text: str
    kind: str
    source: str

    def as_dict(self) -> dict[str, str]:
        return {"prompt": self.text, "kind": self.kind, "source": self.source}


@attrs.frozen
class _Sources:
    """The text the prompts are cut from: Python modules (path, source) and paragraphs (source, text)."""

    modules: list[tuple[str, str]]
    paragraphs: list[tuple[str, str]]
    docstrings: list[tuple[str, str]]
    commands: list[tuple[str, str]]  # (command, its manual page's NAME line)


def sources(roots: dict[str, Path] | None = None) -> _Sources:
    """Read the offline text: ``roots`` maps "stdlib", "doc" and "man" to folders (default: this interpreter's
    standard library, /usr/share/doc, /usr/share/man)."""
    roots = roots or {
        "stdlib": Path(sysconfig.get_paths()["stdlib"]),
        "doc": Path("/usr/share/doc"),
        "man": Path("/usr/share/man"),
    }
    modules: list[tuple[str, str]] = []
    docstrings: list[tuple[str, str]] = []
    for path in _files(roots.get("stdlib"), ("*.py",), skip=_SKIPPED_PARTS):
        text = _read(path)
        if not text or len(text) < 400:
            continue
        modules.append((str(path), text))
        docstrings.extend((str(path), d) for d in _docstrings(text))
    paragraphs = [(s, d) for s, d in docstrings if len(d) > 200]
    for path in _files(roots.get("doc"), ("README*", "*.txt", "*.md", "changelog*", "NEWS*")):
        paragraphs.extend((str(path), p) for p in _paragraphs(_read(path)))
    commands: list[tuple[str, str]] = []
    for path in _files(roots.get("man"), ("man1/*.1.gz", "man8/*.8.gz", "man5/*.5.gz")):
        text = _manual(_read(path))
        paragraphs.extend((str(path), p) for p in _paragraphs(text))
        name = re.search(r"^NAME\n+(.+)$", text, re.MULTILINE)
        if name:
            commands.append((path.name.split(".")[0], name.group(1).strip()))
    if not modules:
        raise ConfigError(
            f"found no Python modules under {roots.get('stdlib')}: decoctl eagle data cuts its code prompts from the "
            "interpreter's standard library"
        )
    return _Sources(modules, paragraphs, docstrings, commands)


def cut_prompts(count: int, *, seed: int = 0, text: _Sources | None = None) -> list[Prompt]:
    """``count`` prompts in the shares of SHARES, in a seeded order that mixes the kinds."""
    text = text or sources()
    rng = np.random.default_rng(seed)
    wanted = {kind: round(count * share) for kind, share in SHARES.items()}
    wanted["code"] += count - sum(wanted.values())
    makers = {"code": _code, "prose": _prose, "instruction": _instruction, "edit": _edit}
    prompts: list[Prompt] = []
    for kind in KINDS:
        made = 0
        tries = 0
        while made < wanted[kind] and tries < 20 * wanted[kind] + 100:
            tries += 1
            prompt = makers[kind](text, rng)
            if prompt is not None and 20 <= len(prompt.text) <= MOST_CHARS:
                prompts.append(prompt)
                made += 1
    order = rng.permutation(len(prompts))
    return [prompts[i] for i in order]


# -- the four kinds ---------------------------------------------------------------------------------------------
def _code(text: _Sources, rng: np.random.Generator) -> Prompt | None:
    source, module = text.modules[int(rng.integers(len(text.modules)))]
    lines = module.splitlines()
    starts = [i for i, line in enumerate(lines) if _DEF.match(line)]
    if not starts:
        return None
    at = starts[int(rng.integers(len(starts)))]
    end = at + 1
    while end < len(lines) and not lines[end - 1].rstrip().endswith(":") and end - at < 6:
        end += 1  # a signature over several lines
    if end < len(lines) and lines[end].strip().startswith(('"""', "'''")):
        end += 1  # and the docstring's first line
    begin = max(0, at - int(rng.integers(4, 40)))
    return Prompt(text="\n".join(lines[begin:end]) + "\n", kind="code", source=source)


def _prose(text: _Sources, rng: np.random.Generator) -> Prompt | None:
    if not text.paragraphs:
        return None
    source, paragraph = text.paragraphs[int(rng.integers(len(text.paragraphs)))]
    words = paragraph.split()
    keep = min(len(words), int(rng.integers(12, 60)))
    return Prompt(text=" ".join(words[:keep]), kind="prose", source=source)


def _instruction(text: _Sources, rng: np.random.Generator) -> Prompt | None:
    choice = int(rng.integers(4))
    if choice == 0 and text.docstrings:
        source, doc = text.docstrings[int(rng.integers(len(text.docstrings)))]
        first = _first_sentence(doc)
        if not first:
            return None
        request = first[0].lower() + first[1:]
        return Prompt(
            text=f"Write a Python function that does the following: {request}\n\n```python\n",
            kind="instruction",
            source=source,
        )
    if choice == 1:
        snippet = _snippet(text, rng)
        if snippet is None:
            return None
        source, code = snippet
        return Prompt(
            text=f"Explain what this code does:\n\n```python\n{code}\n```\n\n", kind="instruction", source=source
        )
    if choice == 2 and text.paragraphs:
        source, paragraph = text.paragraphs[int(rng.integers(len(text.paragraphs)))]
        body = " ".join(paragraph.split()[:150])
        return Prompt(
            text=f"Summarize the following text in one sentence.\n\n{body}\n\nSummary:",
            kind="instruction",
            source=source,
        )
    if text.commands:
        command, name = text.commands[int(rng.integers(len(text.commands)))]
        del name
        return Prompt(
            text=f"Q: What does the `{command}` command do, and how is it used?\nA:",
            kind="instruction",
            source=f"man {command}",
        )
    return None


def _edit(text: _Sources, rng: np.random.Generator) -> Prompt | None:
    choice = int(rng.integers(4))
    if choice < 2:
        snippet = _snippet(text, rng)
        if snippet is None:
            return None
        source, code = snippet
        if choice == 0:
            names = sorted({n for n in re.findall(r"\b([a-z_][a-z0-9_]{2,})\s*=", code) if not keyword.iskeyword(n)})
            if not names:
                return None
            old = names[int(rng.integers(len(names)))]
            new = f"{old}_{['value', 'item', 'data', 'result'][int(rng.integers(4))]}"
            ask = f"Rename the variable `{old}` to `{new}` in this code and show the result:"
        else:
            ask = "Add type hints to this code and show the result:"
        return Prompt(text=f"{ask}\n\n```python\n{code}\n```\n\n```python\n", kind="edit", source=source)
    if not text.paragraphs:
        return None
    source, paragraph = text.paragraphs[int(rng.integers(len(text.paragraphs)))]
    body = " ".join(paragraph.split()[:120])
    if choice == 2:
        return Prompt(
            text=f"Rewrite this paragraph in simpler words:\n\n{body}\n\nRewritten:\n", kind="edit", source=source
        )
    lines = [line for line in paragraph.splitlines() if line.strip()][:12]
    if len(lines) < 3:
        return None
    listed = "\n".join(lines)
    return Prompt(text=f"Sort these lines alphabetically:\n\n{listed}\n\nSorted:\n", kind="edit", source=source)


# -- reading --------------------------------------------------------------------------------------------------------
def _files(
    root: Path | None, patterns: tuple[str, ...], skip: set[str] | frozenset[str] = frozenset()
) -> Iterator[Path]:
    """The files under ``root`` that match ``patterns`` outside folders named in ``skip``: at most MOST_FILES of
    them, an even sample of the sorted list."""
    if root is None or not root.is_dir():
        return
    found: list[Path] = []
    for pattern in patterns:
        found.extend(p for p in root.rglob(pattern) if p.is_file() and not skip & set(p.relative_to(root).parts))
    found = sorted(set(found))
    if len(found) > MOST_FILES:  # an even sample, the same on every run
        step = len(found) / MOST_FILES
        found = [found[int(i * step)] for i in range(MOST_FILES)]
    yield from found


def _read(path: Path) -> str:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return raw.decode("utf-8", errors="replace")
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""


def _docstrings(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 60:
                found.append(doc)
    return found


def _paragraphs(text: str) -> list[str]:
    """Blocks of text between blank lines with enough words and letters to be prose."""
    found = []
    for block in re.split(r"\n\s*\n", text):
        words = block.split()
        letters = sum(c.isalpha() for c in block)
        if len(words) >= 25 and letters > 0.6 * len(block.replace(" ", "").replace("\n", "")):
            found.append(block.strip())
    return found


def _manual(troff: str) -> str:
    """A manual page's text without its troff markup: section headings kept as lines, requests dropped."""
    lines = []
    for line in troff.splitlines():
        if line.startswith((".SH", ".SS")):
            lines.extend(["", line.split(None, 1)[1].strip('"') if " " in line else "", ""])
        elif line.startswith((".PP", ".P", ".LP", ".TP", ".IP")):
            lines.append("")
        elif line.startswith((".", "'")):
            continue
        else:
            lines.append(_TROFF_ESCAPE.sub("", line.replace("\\-", "-")).replace("\\", ""))
    return "\n".join(lines)


def _first_sentence(doc: str) -> str:
    first = " ".join(doc.split("\n\n")[0].split())
    end = first.find(". ")
    first = first if end < 0 else first[: end + 1]
    return first if 20 <= len(first) <= 300 else ""


def _snippet(text: _Sources, rng: np.random.Generator) -> tuple[str, str] | None:
    """A function or class of the standard library, whole, of 4 to 30 lines."""
    source, module = text.modules[int(rng.integers(len(text.modules)))]
    try:
        tree = ast.parse(module)
    except (SyntaxError, ValueError):
        return None
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    nodes = [n for n in nodes if n.end_lineno is not None and 4 <= n.end_lineno - n.lineno + 1 <= 30]
    if not nodes:
        return None
    node = nodes[int(rng.integers(len(nodes)))]
    lines = module.splitlines()[node.lineno - 1 : node.end_lineno]
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return source, "\n".join(line[indent:] for line in lines)

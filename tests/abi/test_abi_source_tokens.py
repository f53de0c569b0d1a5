"""ABI 1.4: source_tokens gives a C controller the generation's source, an encoder-decoder target's encoded prompt
(tests/abi/c/source_lookup.c: prompt lookup over the source and the output, greedy's tokens on the tiny T5 and
BART); a decoder-only target has none; a library built against the 1.3 header runs unchanged."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from decoctl import Generator
from decoctl.abi import library_controller_spec
from decoctl.plugins import PluginRegistry

ROOT = Path(__file__).resolve().parents[2]
SOURCE_LOOKUP_C = ROOT / "tests" / "abi" / "c" / "source_lookup.c"
HEADER = ROOT / "abi" / "decoctl.h"
HEADER_1_3 = ROOT / "tests" / "abi" / "c" / "abi-1.3"  # abi/decoctl.h as ABI 1.3 shipped it, frozen
GREEDY_C = ROOT / "examples" / "c_controller" / "greedy.c"
PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, item):", "for x in range(10):")
NEW = 24

Compile = Callable[..., Path]


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """tests/encdec's tiny T5 and BART exports (tests/encdec/seq2seq_exports.py)."""
    pytest.importorskip("torch", reason="the encoder-decoder exports need torch (the test extra brings it)")
    pytest.importorskip("transformers", reason="the encoder-decoder exports are built with transformers")
    spec = importlib.util.spec_from_file_location("seq2seq_exports", ROOT / "tests" / "encdec" / "seq2seq_exports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Seq2SeqExports(tmp_path_factory.mktemp("seq2seq"))


@pytest.fixture(scope="module")
def source_lookup(compile_c: Compile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_c(SOURCE_LOOKUP_C, tmp_path_factory.mktemp("source-lookup") / "libsource_lookup.so")


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_a_c_lookup_over_the_source_gives_greedy_s_tokens(
    seq2seq: Any, source_lookup: Path, registry: PluginRegistry, name: str
) -> None:
    folder = str(seq2seq.folder(name))
    greedy = Generator({"target": folder}, "greedy", registry=registry, threads=1)
    lookup = Generator({"target": folder}, f"{source_lookup}:source_lookup", registry=registry, threads=1)
    from_source = 0
    for prompt in PROMPTS:
        result = lookup.generate(prompt, max_new_tokens=NEW)
        assert result.tokens == greedy.generate(prompt, max_new_tokens=NEW).tokens, prompt
        seen = result.stats.controller
        source = greedy.tokenizer.encode(prompt)
        assert (seen["abi_minor"], seen["has_source_tokens"]) == (4, 1)
        assert (seen["source_n"], seen["source"]) == (len(source), source)
        assert seen["forwards"] == result.stats.forwards["target"]
        from_source += seen["from_source"]
    assert from_source > 0  # some drafts were copied from the source


def test_a_decoder_only_target_has_no_source(
    optimum_model: Path, source_lookup: Path, registry: PluginRegistry
) -> None:
    expected = Generator({"target": optimum_model}, "greedy", registry=registry, threads=1).generate(
        PROMPTS[0], max_new_tokens=12
    )
    result = Generator(
        {"target": optimum_model}, f"{source_lookup}:source_lookup", registry=registry, threads=1
    ).generate(PROMPTS[0], max_new_tokens=12)
    assert result.tokens == expected.tokens
    seen = result.stats.controller
    assert (seen["has_source_tokens"], seen["source_n"], seen["source_null"], seen["source"]) == (1, 0, 1, [])


def test_a_library_built_against_the_1_3_header_runs_unchanged(
    seq2seq: Any, registry: PluginRegistry, compile_c: Compile, tmp_path: Path
) -> None:
    header = (HEADER_1_3 / "decoctl.h").read_text(encoding="utf-8")
    assert "#define DECOCTL_ABI_MINOR 3 " in header
    # next to the source, the 1.3 header is the decoctl.h that `#include "decoctl.h"` finds first
    source = tmp_path / "greedy.c"
    source.write_text(GREEDY_C.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "decoctl.h").write_text(header, encoding="utf-8")
    library = compile_c(source, tmp_path / "libgreedy13.so")
    assert library_controller_spec(library, "greedy").plugin  # loads: a 1.3 entry on a 1.4 host
    folder = str(seq2seq.folder("t5"))
    expected = Generator({"target": folder}, "greedy", registry=registry, threads=1).generate(
        PROMPTS[0], max_new_tokens=12
    )
    result = Generator({"target": folder}, f"{library}:greedy", registry=registry, threads=1).generate(
        PROMPTS[0], max_new_tokens=12
    )
    assert result.tokens == expected.tokens


def test_the_1_3_header_is_the_current_one_up_to_its_end() -> None:
    """Every 1.3 declaration is still there, unchanged and in place: only source_tokens was appended."""
    old = (HEADER_1_3 / "decoctl.h").read_text(encoding="utf-8")
    new = HEADER.read_text(encoding="utf-8")
    for struct, end in (("decoctl_host", "} decoctl_host;"), ("decoctl_controller", "} decoctl_controller;")):
        start = f"typedef struct {struct} {{"
        old_body = old[old.index(start) : old.index(end, old.index(start))]
        new_body = new[new.index(start) : new.index(end, new.index(start))]
        assert _declarations(new_body)[: len(_declarations(old_body))] == _declarations(old_body)
    appended = new[new.index("(*process_outputs)") : new.index("} decoctl_host;")]
    assert _declarations(appended)[-1] == (
        "int32_t (*source_tokens)(void *host_data, const int64_t **out_tokens, int64_t *out_n);"
    )


def _declarations(text: str) -> list[str]:
    """The code of a struct body without its comments and whitespace, one declaration per entry."""
    code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return [" ".join(part.split()) + ";" for part in " ".join(code.split()).split(";") if part.strip()]

"""ABI 1.3: rows (fork, reorder, release, step_rows, the row_* functions), outputs (new_output, commit_to,
output_done, score, rank_outputs, process_outputs) and the descriptor's rows_for, through the Generator, against
Python's own results; and libraries built against the 1.2 header, which must load and run unchanged.

The controllers come from tests/abi/c/rows.c.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import (
    AbiError,
    ConfigError,
    ControllerSpec,
    GenerationError,
    GenerationResult,
    Generator,
    ProcessContext,
    ProcessorSpec,
    SequenceError,
    hookimpl,
)
from decoctl.abi import ffi, library_controller_spec
from decoctl.host import Host
from decoctl.plugins import PluginRegistry
from decoctl.specs import Option

PROMPT = "def fib(n):"
ROOT = Path(__file__).resolve().parents[2]
ROWS_C = ROOT / "tests" / "abi" / "c" / "rows.c"
HEADER = ROOT / "abi" / "decoctl.h"
HEADER_1_2 = ROOT / "tests" / "abi" / "c" / "abi-1.2"  # abi/decoctl.h as ABI 1.2 shipped it, frozen
GREEDY_C = ROOT / "examples" / "c_controller" / "greedy.c"

Compile = Callable[..., Path]


@pytest.fixture(scope="module")
def c_rows(compile_c: Compile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_c(ROWS_C, tmp_path_factory.mktemp("rows") / "librows.so")


def generate(model: Path, reference: str, registry: PluginRegistry, n: int = 12, **options: Any) -> GenerationResult:
    return Generator({"target": model}, reference, registry=registry, threads=1, **options).generate(
        PROMPT, max_new_tokens=n
    )


# -- the Python twin of rows.c's beam -----------------------------------------------------------------------------


class PyBeam:
    """rows.c's beam, with the Python primitives: the same candidates, order, scores and calls."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.beams = int(options["beams"])

    def start(self, host: Host) -> None:
        del host

    def step(self, host: Host) -> None:
        beams, rows, target = self.beams, host.rows("target"), host.target
        prompt, steps = target.length, host.remaining
        current = np.repeat(np.asarray(target.logits()[-1:], np.float64), beams, axis=0)
        forks = [rows.fork(0) for _ in range(1, beams)]
        assert forks == list(range(1, beams))
        scores = np.full(beams, -np.inf)
        scores[0] = 0.0
        chosen = np.zeros(beams, np.int64)
        for _ in range(steps):
            top = current.max(axis=1, keepdims=True)
            logprobs = current - (top + np.log(np.exp(current - top).sum(axis=1, keepdims=True)))
            candidates = np.where(np.isfinite(scores)[:, None], scores[:, None] + logprobs, -np.inf).reshape(-1)
            best = np.argsort(-candidates, kind="stable")[:beams]  # of equal scores the lower index first
            parents, chosen, scores = best // current.shape[1], best % current.shape[1], candidates[best]
            rows.reorder(parents)
            current = np.asarray(rows.step(chosen, rows=list(range(beams))), np.float64)
        for beam in range(beams):
            output = 0 if beam == 0 else host.new_output()
            host.commit(rows[beam].tokens[prompt:], output=output)
            host.score(output, float(scores[beam]))
        order = list(range(beams))[::-1]
        host.rank_outputs(order)
        host.rank_outputs(order)
        for beam in range(1, beams):
            rows.release(beam)


class PyBeamPlugin:
    @hookimpl
    def decoctl_controllers(self) -> list[ControllerSpec]:
        return [
            ControllerSpec(
                name="py_beam",
                summary="rows.c's beam in Python",
                factory=PyBeam,
                options=(Option(name="beams", type="int", default=2, minimum=1),),
                rows_for=lambda options: int(options["beams"]),
            )
        ]


# -- rows and outputs from C, against Python -----------------------------------------------------------------------


def test_the_descriptors_rows_for_sizes_the_roles_rows(c_rows: Path) -> None:
    spec = library_controller_spec(c_rows, "parallel_greedy")
    assert spec.rows({"rows": 3}) == 3
    assert library_controller_spec(c_rows, "beam").rows({"beams": 4}) == 4


@pytest.mark.parametrize("rows", [2, 3])
def test_parallel_greedy_over_forked_rows_gives_greedy_in_every_output(
    rows: int, genai_model: Path, c_rows: Path, registry: PluginRegistry
) -> None:
    expected = generate(genai_model, "greedy", registry, n=16)
    result = generate(genai_model, f"{c_rows}:parallel_greedy", registry, n=16, options={"rows": rows})
    assert len(result.completions) == rows
    for completion in result.completions:
        assert completion.tokens == expected.tokens
        assert completion.text == expected.text
    assert result.tokens == expected.tokens


class Cycle:
    """Favours token 100 + (prefix length % 4): what it does to a row depends on the row's own prefix. Stateless
    (nothing kept between calls), so several outputs may share it."""

    stateless = True

    def __init__(self, options: dict[str, Any]) -> None:
        del options

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for row in range(len(rows)):
            rows[row, 100 + len(context.prefix(row)) % 4] += 4.0
        return rows


class Remembers(Cycle):
    """Cycle, but declaring state of its own (commit and reset): several outputs would share it."""

    stateless = False

    def commit(self, tokens: Any) -> None:
        del tokens

    def reset(self, prompt: np.ndarray) -> None:
        del prompt


class Clones(Remembers):
    """Remembers, with a clone() for each further output."""

    def clone(self) -> Clones:
        return Clones({})


class CyclePlugin:
    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        return [
            ProcessorSpec(name="cycle", summary="favour a cycle of four tokens", factory=Cycle),
            ProcessorSpec(name="remembers", summary="cycle with state", factory=Remembers),
            ProcessorSpec(name="clones", summary="cycle with state and clone()", factory=Clones),
        ]


def test_process_outputs_runs_the_chain_on_each_outputs_own_prefix(genai_model: Path, c_rows: Path) -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(CyclePlugin(), "cycle")
    expected = generate(genai_model, "greedy", registry, n=16, processors="cycle")
    assert expected.tokens != generate(genai_model, "greedy", registry, n=16).tokens
    result = generate(genai_model, f"{c_rows}:parallel_greedy", registry, n=16, processors="cycle")
    assert [c.tokens for c in result.completions] == [expected.tokens] * 2


def test_new_output_with_a_stateful_processor_is_refused_naming_it(genai_model: Path, c_rows: Path) -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(CyclePlugin(), "cycle")
    with pytest.raises(GenerationError) as caught:
        generate(genai_model, f"{c_rows}:parallel_greedy", registry, n=4, processors="remembers")
    assert isinstance(caught.value.__cause__, ConfigError)
    assert "holds state per sequence (remembers)" in str(caught.value.__cause__)
    assert "which returned -5" in "".join(caught.value.__cause__.__notes__)  # DECOCTL_ERR_ARGUMENT


def test_new_output_with_a_stateful_processor_that_clones_serves_every_output(genai_model: Path, c_rows: Path) -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(CyclePlugin(), "cycle")
    expected = generate(genai_model, "greedy", registry, n=16, processors="clones")
    result = generate(genai_model, f"{c_rows}:parallel_greedy", registry, n=16, processors="clones")
    assert [c.tokens for c in result.completions] == [expected.tokens] * 2


def test_parallel_greedy_keeps_its_step_outputs_alive_in_debug_mode(
    genai_model: Path, c_rows: Path, registry: PluginRegistry
) -> None:
    """The controller reads each step_rows output in the next step (within its lifetime): in debug mode the host
    hands out copies and fills them with NaN only once that lifetime ends, so greedy must come out unchanged."""
    expected = generate(genai_model, "greedy", registry, n=10)
    generator = Generator(
        {"target": genai_model}, f"{c_rows}:parallel_greedy", registry=registry, threads=1, debug=True
    )
    result = generator.generate(PROMPT, max_new_tokens=10)
    assert [c.tokens for c in result.completions] == [expected.tokens] * 2


@pytest.mark.parametrize("beams", [2, 3])
def test_a_c_beam_search_equals_the_same_search_on_pythons_rows(beams: int, genai_model: Path, c_rows: Path) -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(PyBeamPlugin(), "py-beam")
    expected = generate(genai_model, "py_beam", registry, n=10, options={"beams": beams})
    result = generate(genai_model, f"{c_rows}:beam", registry, n=10, options={"beams": beams})
    assert len(result.completions) == len(expected.completions) == beams
    for got, want in zip(result.completions, expected.completions, strict=True):
        assert got.tokens == want.tokens
        assert got.text == want.text
        assert got.score == pytest.approx(want.score, rel=1e-9, abs=1e-9)
    scores = [c.score for c in result.completions]
    assert scores == sorted(scores, reverse=True)  # ranked back into the search's order, best first
    assert len({c.tokens for c in result.completions}) > 1  # the beams differ: reorder really moved rows


def test_c_rows_of_a_concatenated_cache_model_step_one_run_per_row(optimum_model: Path, c_rows: Path) -> None:
    """An Optimum-layout model's rows are caches of their own, stepped one Run per row: the same C controllers give
    what they give on a shared buffer (greedy in every row; the beams of the Python twin)."""
    registry = PluginRegistry(autoload=False)
    registry.register(PyBeamPlugin(), "py-beam")
    greedy = generate(optimum_model, "greedy", registry, n=10)
    parallel = generate(optimum_model, f"{c_rows}:parallel_greedy", registry, n=10, options={"rows": 3})
    assert [c.tokens for c in parallel.completions] == [greedy.tokens] * 3
    assert parallel.stats.trace["rows"] == "one Run per row (concatenated KV cache)"
    expected = generate(optimum_model, "py_beam", registry, n=10, options={"beams": 3})
    result = generate(optimum_model, f"{c_rows}:beam", registry, n=10, options={"beams": 3})
    assert [c.tokens for c in result.completions] == [c.tokens for c in expected.completions]
    assert [c.score for c in result.completions] == pytest.approx([c.score for c in expected.completions], rel=1e-9)


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        (0, SequenceError, r"fork\(0\) on role 'target': all 1 rows are live"),
        (1, SequenceError, r"release\(0\) on role 'target': row 0 is the role's own sequence"),
        (2, ConfigError, r"step_rows\(\): rows and tokens must not be NULL and n \(0\) at least 1"),
        (3, SequenceError, r"parent 5 \(of row 0\) is not a live row"),
        (4, SequenceError, r"role 'target' has no row 5"),
        (5, SequenceError, r"output 3 does not exist"),
        (6, SequenceError, r"name a row twice"),
        (7, SequenceError, r"has no logits yet"),
        (11, SequenceError, r"output 4 does not exist"),
    ],
)
def test_misused_rows_and_outputs_come_back_as_the_hosts_errors(
    case: int, error: type[Exception], message: str, genai_model: Path, c_rows: Path, registry: PluginRegistry
) -> None:
    with pytest.raises(GenerationError) as caught:
        generate(genai_model, f"{c_rows}:rows_misuse", registry, n=4, options={"case": case})
    cause = caught.value.__cause__
    assert isinstance(cause, error)
    assert re.search(message, str(cause)), str(cause)
    assert "raised inside a host function called by C controller 'rows_misuse'" in "".join(cause.__notes__)


@pytest.mark.parametrize(("debug", "read"), [(True, "NaN"), (False, "a number")])
def test_a_step_output_kept_past_its_lifetime_reads_nan_in_debug_mode(
    debug: bool, read: str, genai_model: Path, c_rows: Path, registry: PluginRegistry
) -> None:
    generator = Generator(
        {"target": genai_model},
        f"{c_rows}:rows_misuse",
        registry=registry,
        threads=1,
        debug=debug,
        options={"case": 10},
    )
    with pytest.raises(GenerationError) as caught:
        generator.generate(PROMPT, max_new_tokens=4)
    assert isinstance(caught.value.__cause__, AbiError)
    assert f"a stale step_rows output reads {read}" in str(caught.value.__cause__)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (8, r"rows_for returned status -1: case 8: rows_for refuses these options"),
        (9, r"rows_for returned 0, not a row count \(return at least 1\)"),
    ],
)
def test_a_rows_for_that_fails_is_an_abi_error_with_its_message(
    case: int, message: str, genai_model: Path, c_rows: Path, registry: PluginRegistry
) -> None:
    with pytest.raises((AbiError, GenerationError)) as caught:
        generate(genai_model, f"{c_rows}:rows_misuse", registry, n=4, options={"case": case})
    error = caught.value if isinstance(caught.value, AbiError) else caught.value.__cause__
    assert isinstance(error, AbiError)
    assert re.search(message, str(error)), str(error)


# -- 1.2 libraries on a 1.3 host ------------------------------------------------------------------------------------


def test_the_host_table_grew_at_its_end_only() -> None:
    fields = [name for name, _ in ffi.typeof("decoctl_host").fields]
    assert fields.index("argmax") < fields.index("fork") < fields.index("process_outputs")
    assert fields[-1] == "source_tokens"  # ABI 1.4's one field after 1.3's process_outputs
    assert [name for name, _ in ffi.typeof("decoctl_controller").fields][-1] == "rows_for"


def test_a_library_built_against_the_1_2_header_runs_unchanged(
    genai_model: Path, registry: PluginRegistry, compile_c: Compile, tmp_path: Path
) -> None:
    header = (HEADER_1_2 / "decoctl.h").read_text(encoding="utf-8")
    assert "#define DECOCTL_ABI_MINOR 2 " in header
    # next to the source, the 1.2 header is the decoctl.h that `#include "decoctl.h"` finds first
    source = tmp_path / "greedy.c"
    source.write_text(GREEDY_C.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "decoctl.h").write_text(header, encoding="utf-8")
    library = compile_c(source, tmp_path / "libgreedy12.so")
    assert library_controller_spec(library, "greedy").plugin  # loads: a 1.2 entry on a 1.3 host
    assert library_controller_spec(library, "greedy").rows({}) == 1
    expected = generate(genai_model, "greedy", registry, n=12)
    result = generate(genai_model, f"{library}:greedy", registry, n=12)
    assert result.tokens == expected.tokens
    assert [c.tokens for c in result.completions] == [expected.tokens]


def test_a_descriptor_that_ends_before_rows_for_is_never_read_past_its_size(
    genai_model: Path, registry: PluginRegistry, compile_c: Compile, tmp_path: Path
) -> None:
    library = compile_c(ROWS_C, tmp_path / "librows12.so", "-DAS_ABI_1_2")
    spec = library_controller_spec(library, "parallel_greedy")
    assert spec.rows({"rows": 2}) == 1  # rows_for is set in the struct, but its struct_size says 1.2
    with pytest.raises(GenerationError) as caught:
        generate(genai_model, f"{library}:parallel_greedy", registry, n=4)
    assert isinstance(caught.value.__cause__, SequenceError)
    assert "all 1 rows are live" in str(caught.value.__cause__)


def test_the_1_2_header_is_the_current_one_up_to_its_end() -> None:
    """Every 1.2 declaration is still there, unchanged and in place: only fields after them were added."""
    old = (HEADER_1_2 / "decoctl.h").read_text(encoding="utf-8")
    new = HEADER.read_text(encoding="utf-8")
    for struct, last in (("decoctl_host", "argmax"), ("decoctl_controller", "stats_json")):
        start = f"typedef struct {struct} {{"
        old_body = old[old.index(start) : old.index(f"(*{last})", old.index(start))]
        new_body = new[new.index(start) : new.index(f"(*{last})", new.index(start))]
        assert _declarations(old_body) == _declarations(new_body)


def _declarations(text: str) -> list[str]:
    """The code of a struct body without its comments and whitespace."""
    code = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return [" ".join(line.split()) for line in code.splitlines() if line.strip()]

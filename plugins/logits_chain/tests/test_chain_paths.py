"""Each row is processed with its own prefix: row i of a drafted chain sees what plain decoding would see after
committing the drafted tokens before it, so verifiers get exactly the plain decoding distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from chain_cases import STATELESS_CHAINS, random_case

from decoctl import ControllerSpec, Generator, Host, ProcessContext, hookimpl
from decoctl.plugins import PluginRegistry
from decoctl.testing import EOS_TOKEN_ID

PROMPT = "def fib(n):"


@pytest.mark.parametrize("chain", STATELESS_CHAINS)
def test_a_drafted_row_equals_plain_processing_after_committing_the_draft(chain: str, build: Any) -> None:
    for seed in range(3):
        rows, context = random_case(seed)
        together = build(chain)(rows.copy(), context)
        for index, path in enumerate(context.paths):
            committed = np.concatenate((context.output, np.asarray(path, np.int64)))
            alone = ProcessContext(context.prompt, committed, [[]], eos_token_ids=context.eos_token_ids)
            np.testing.assert_array_equal(together[index], build(chain)(rows[index : index + 1].copy(), alone)[0])


@pytest.mark.parametrize("chain", STATELESS_CHAINS)
def test_a_fully_masked_row_stays_masked_without_nan(chain: str, build: Any) -> None:
    rows, context = random_case(0)
    rows[1] = -np.inf
    with np.errstate(all="raise"):
        out = build(chain)(rows, context)
    assert np.all(out[1] == -np.inf)
    assert not np.isnan(out).any()


class Probe:
    """A controller that hands the host rows for a drafted chain and a tree, keeps what process() returned,
    then commits the first drafted token."""

    drafted = (300, 301)
    seen: ClassVar[list[np.ndarray]] = []

    def __init__(self, options: Any) -> None:
        del options

    def start(self, host: Host) -> None:
        del host

    def step(self, host: Host) -> None:
        rows = np.full((3, host.target.vocab_size), 2.0, np.float32)
        Probe.seen = [host.process(rows, list(self.drafted)), host.process(rows, paths=[[], [302], [303, 304]])]
        host.commit([self.drafted[0]])


class ProbePlugin:
    @hookimpl
    def decoctl_controllers(self) -> list[ControllerSpec]:
        return [ControllerSpec(name="probe", summary="records host.process rows", factory=Probe)]


def test_host_process_gives_each_drafted_row_its_own_prefix(tiny_model: Path, registry: PluginRegistry) -> None:
    registry.register(ProbePlugin(), "probe")
    generator = Generator(
        {"target": tiny_model}, "probe", processors="repetition_penalty=2,min_new_tokens=2", registry=registry
    )
    generator.generate(PROMPT, max_new_tokens=1)
    prompt = set(generator.tokenizer.encode(PROMPT))
    assert not prompt & {300, 301, 302, 303, 304, EOS_TOKEN_ID}
    chain, tree = Probe.seen
    penalised = [set(np.flatnonzero(row == 1.0)) for row in chain]
    assert penalised == [prompt, prompt | {300}, prompt | {300, 301}]
    assert [row[EOS_TOKEN_ID] for row in chain] == [-np.inf, -np.inf, 2.0]  # row 2 follows 2 new tokens
    penalised = [set(np.flatnonzero(row == 1.0)) for row in tree]
    assert penalised == [prompt, prompt | {302}, prompt | {303, 304}]
    assert [row[EOS_TOKEN_ID] for row in tree] == [-np.inf, -np.inf, 2.0]

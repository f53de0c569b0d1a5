"""Tiny models for the EAGLE tests: a one-layer target (tree inputs, hidden states) and two heads for it.

The imitating head runs the target's own layer on the token embeddings (decoctl.testing.build_eagle_head's
copy_layer), so it agrees with the target most of the time and long drafts get accepted; the random head agrees
by chance only, and its output depends on the features it is fed, which makes a wrong feature visible.

``CostedEagle`` is the eagle controller timed by a cost model instead of the machine, so that what its draft-length
rule chooses is the same on every machine; the ``costed`` registry offers it as ``eagle-cheap-head`` and
``eagle-dear-head``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
from decoctl_eagle import plugin
from decoctl_eagle.controller import HEAD, Eagle

from decoctl import ControllerSpec, Host, hookimpl
from decoctl.plugins import PluginRegistry
from decoctl.testing import ForwardCostClock, build_eagle_head, build_genai_model

SEED = 41
#: what one head forward costs in the cost model, in ms (a target forward: 1 ms plus 0.1 ms per token it feeds)
HEAD_COSTS = {"cheap": 0.02, "dear": 5.0}


class CostedEagle(Eagle):
    """The eagle controller whose clock counts forwards: a target forward costs 1 ms plus ``per_token`` ms (0.1) per
    token it feeds, a head forward ``head_ms``. The draft-length rule learns these costs as it would learn measured
    ones."""

    def __init__(
        self,
        options: dict[str, Any],
        *,
        head_ms: float,
        per_token: float = 0.1,
        extra: Callable[[int], float] | None = None,
    ) -> None:
        # per_token on every token a forward feeds (1 + per_token for its first); extra, instead: ms for each token
        # past the first, a function of the target forwards so far (a machine whose load changes)
        if extra is None:
            self.cost_clock = ForwardCostClock(per_token, base_ms=1 + per_token, role_ms={HEAD: head_ms})
        else:
            self.cost_clock = ForwardCostClock(extra, role_ms={HEAD: head_ms})
        self.head_ms = head_ms
        super().__init__(options, clock=self.cost_clock)

    def start(self, host: Host) -> None:
        self.cost_clock.start(host)
        super().start(host)


class CostedPlugin:
    """``eagle-cheap-head`` and ``eagle-dear-head``: the eagle controller timed by the cost model;
    ``eagle-dear-verify``: a cheap head beside a target whose forward over two tokens costs 1.48 one-token ones (a CPU
    with AVX-512, one thread)."""

    @hookimpl
    def decoctl_controllers(self) -> list[ControllerSpec]:
        (eagle,) = plugin.decoctl_controllers()
        return [
            *(
                attrs.evolve(eagle, name=f"eagle-{name}-head", factory=partial(CostedEagle, head_ms=ms))
                for name, ms in HEAD_COSTS.items()
            ),
            attrs.evolve(
                eagle,
                name="eagle-dear-verify",
                factory=partial(CostedEagle, head_ms=HEAD_COSTS["cheap"], per_token=0.48),
            ),
            # busy for the first 40 target forwards (a forward over n tokens: 1 + 1.5 (n - 1) ms), then free
            attrs.evolve(
                eagle,
                name="eagle-busy-then-free",
                factory=partial(CostedEagle, head_ms=HEAD_COSTS["cheap"], extra=lambda n: 1.5 if n < 40 else 0.02),
            ),
        ]


@pytest.fixture(scope="session")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(
        tmp_path_factory.mktemp("target"), seed=SEED, num_layers=1, hidden_states=True, tree_inputs=True
    )


@pytest.fixture(scope="session")
def plain_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights as ``target`` without the tree inputs."""
    return build_genai_model(tmp_path_factory.mktemp("plain"), seed=SEED, num_layers=1, hidden_states=True)


@pytest.fixture(scope="session")
def mimic_head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle_head(tmp_path_factory.mktemp("mimic"), target, copy_layer=0, feature_mix=0.1, tree_inputs=True)


@pytest.fixture(scope="session")
def random_head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle_head(tmp_path_factory.mktemp("random"), target, seed=42, tree_inputs=True)


@pytest.fixture(scope="session")
def narrow_head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The imitating head drafting from a draft vocabulary of half the target's tokens."""
    vocab = json.loads((target / "genai_config.json").read_text())["model"]["vocab_size"]
    return build_eagle_head(
        tmp_path_factory.mktemp("narrow"),
        target,
        copy_layer=0,
        feature_mix=0.1,
        tree_inputs=True,
        draft_vocab=vocab // 2,
    )


@pytest.fixture(params=["mimic", "random", "narrow"])
def head(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_head")


@pytest.fixture
def registry() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "eagle")
    return registry


@pytest.fixture
def costed(registry: PluginRegistry) -> PluginRegistry:
    """The eagle plugin and the cost-model controllers."""
    registry.register(CostedPlugin(), "costed-eagle")
    return registry


@pytest.fixture
def demo_costed() -> PluginRegistry:
    """Every installed plugin (the demo models among them) and the cost-model controllers."""
    registry = PluginRegistry()
    registry.register(CostedPlugin(), "costed-eagle")
    return registry

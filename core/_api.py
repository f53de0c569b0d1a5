"""The public API, written once: the modules whose ``__all__`` decoctl's version number promises.

The API reference (``make docs``) documents exactly these modules, and a plugin distribution imports nothing of
decoctl's but them (the import-linter contract in pyproject.toml, held to this tuple by tests/test_layering.py, as
docs/ARCHITECTURE.md's list is). Every other module is private: its name, or a package above it, starts with an
underscore, and it may change in any release.
"""

from __future__ import annotations

__all__ = ["PUBLIC_MODULES"]

PUBLIC_MODULES = (
    # the API: generation, plugins and their records, controllers, the host's primitives, logits processors
    "decoctl",
    "decoctl.errors",
    "decoctl.logs",
    "decoctl.specs",
    "decoctl.generation",
    "decoctl.plugins",
    "decoctl.controllers",
    "decoctl.verify",
    "decoctl.draft_length",
    "decoctl.host",
    "decoctl.processing",
    "decoctl.abi",
    # the model runtime: loading, graph rewrites, the EAGLE head writer
    "decoctl.model",
    "decoctl.model.graph",
    "decoctl.model.eagle_graph",
    # the commands' Python side: the benchmark, the server, Ray, model imports, the command line
    "decoctl.bench",
    "decoctl.serve",
    "decoctl.ray",
    "decoctl.importers",
    "decoctl.cli",
    # for the tests of decoctl and of plugins (the decoctl[testing] extra)
    "decoctl.testing",
    "decoctl.testing.vlm",
    "decoctl.testing.vlm_qwen",
    "decoctl.testing.vlm_gemma3",
)

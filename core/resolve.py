"""Turn what a user typed into things: a model name or path into a folder, a controller reference into a
ControllerSpec, a processor chain string into processors."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decoctl.errors import ConfigError, ModelLoadError, PluginError
from decoctl.importers.registry import find_registered, load_registry
from decoctl.processing import LogitsProcessor, ProcessorChain
from decoctl.specs import ControllerSpec, normalise_name, parse_options

if TYPE_CHECKING:
    from decoctl.plugins import PluginRegistry

__all__ = [
    "DEFAULT_MODEL",
    "LIBRARY_SUFFIXES",
    "parse_processor_chain",
    "resolve_controller",
    "resolve_model",
]

DEFAULT_MODEL = "pycode"
LIBRARY_SUFFIXES = (".so", ".dylib", ".dll")


def resolve_model(reference: str | Path | None, registry: PluginRegistry) -> tuple[str, Path]:
    """(display name, folder) for a registered model name or a folder path; None means the default model."""
    if reference is None:
        bundles = registry.models()
        if DEFAULT_MODEL not in bundles:
            raise ModelLoadError(
                f"no model was given and the default model {DEFAULT_MODEL!r} is not installed: install the demo "
                "models (make setup) or pass --model PATH to an exported model folder"
            )
        return DEFAULT_MODEL, bundles[DEFAULT_MODEL].path
    text = str(reference)
    path = Path(text).expanduser()
    looks_like_path = isinstance(reference, Path) or "/" in text or text.startswith(".") or path.exists()
    if looks_like_path:
        return path.name or text, path
    bundles = registry.models()
    bundle = bundles.get(normalise_name(text))
    if bundle is None:
        # after plugin bundles: the user-level registry that `decoctl models import` writes
        imported = find_registered(text)
        if imported is not None:
            return imported.name, imported.path
        names = ", ".join(sorted({*bundles, *load_registry()})) or "none installed"
        raise ModelLoadError(
            f"model {text!r} is neither a folder nor a registered model (registered: {names}): pass the path of "
            "an exported model folder, install the plugin that provides it, or import it "
            "(`decoctl models import gemma3-270m`)"
        )
    return bundle.name, bundle.path


def resolve_controller(reference: str, registry: PluginRegistry) -> ControllerSpec:
    """A registered name, ``path/to/file.py:Class``, ``package.module:Class``, ``lib.so:name`` or ``lib.so`` (the
    library's controller, when it provides exactly one)."""
    controllers = registry.controllers()
    spec = controllers.get(normalise_name(reference))
    if spec is not None:
        return spec
    if reference.endswith(LIBRARY_SUFFIXES):
        return _library_controller(Path(reference), None)
    if ":" not in reference:
        names = ", ".join(sorted(controllers))
        raise PluginError(
            f"unknown controller {reference!r} (installed: {names}): install the plugin that provides it, or "
            "give file.py:Class, package.module:Class, library.so:name or library.so"
        )
    location, _, attribute = reference.rpartition(":")
    if location.endswith(LIBRARY_SUFFIXES):
        return _library_controller(Path(location), attribute)
    return _python_controller(reference, location, attribute)


def _library_controller(path: Path, symbol: str | None) -> ControllerSpec:
    """The controller ``symbol`` of the library at ``path``; None: its only one (PluginError listing the names
    when it provides several)."""
    if not path.is_file():
        raise PluginError(f"shared library {path} does not exist: build it (see examples/c_controller) or fix the path")
    from decoctl import abi  # cffi and the compiled bridge load only for C controllers (AbiError without it)

    return abi.library_controller_spec(path.resolve(), symbol)


def _python_controller(reference: str, location: str, attribute: str) -> ControllerSpec:
    if location.endswith(".py"):
        module = _module_from_file(Path(location), reference)
    else:
        try:
            module = importlib.import_module(location)
        except ImportError as exc:
            raise PluginError(f"controller {reference!r}: cannot import module {location!r} ({exc})") from exc
    target = getattr(module, attribute, None)
    if target is None or not callable(target):
        raise PluginError(f"controller {reference!r}: {location} has no class or factory named {attribute!r}")
    doc = inspect.getdoc(target) or ""
    return ControllerSpec(
        name=attribute,
        summary=doc.splitlines()[0] if doc else f"{attribute} from {location}",
        factory=target,
        roles=tuple(getattr(target, "roles", ("target",))),
        capabilities=dict(getattr(target, "capabilities", {})),
        options=tuple(getattr(target, "options", ())),
        plugin=location,
    )


def _module_from_file(path: Path, reference: str) -> Any:
    if not path.is_file():
        raise PluginError(f"controller {reference!r}: file {path} does not exist")
    module_name = f"decoctl_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"controller {reference!r}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # any error in user code is reported with the file it came from
        del sys.modules[module_name]
        raise PluginError(f"controller {reference!r}: importing {path} failed ({type(exc).__name__}: {exc})") from exc
    return module


def _split_items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_processor_chain(chain: str | list[Any] | None, registry: PluginRegistry) -> ProcessorChain:
    """Build a chain from ``"name=value,name=value"`` or a list of ``{"name": ..., **options}`` tables.

    ``name=value`` sets a processor's single main option (the first in its schema); ``name`` alone uses its
    defaults. Unknown processors and bad values raise ConfigError before generation starts.
    """
    if not chain:
        return ProcessorChain()
    items: list[tuple[str, dict[str, Any]]] = []
    if isinstance(chain, str):
        for item in _split_items(chain):
            name, sep, value = item.partition("=")
            items.append((name.strip(), {"__main__": value.strip()} if sep else {}))
    else:
        for entry in chain:
            if not isinstance(entry, dict) or "name" not in entry:
                raise ConfigError(f"processor entry {entry!r} must be a table with a 'name' key")
            options = {k: v for k, v in entry.items() if k != "name"}
            items.append((str(entry["name"]), options))
    specs = registry.processors()
    processors: list[LogitsProcessor] = []
    for name, given in items:
        spec = specs.get(normalise_name(name))
        if spec is None:
            known = ", ".join(sorted(specs)) or "none installed (pip install decoctl-logits-chain)"
            raise ConfigError(f"unknown logits processor {name!r} (installed: {known})")
        if "__main__" in given:
            if not spec.options:
                raise ConfigError(f"logits processor {spec.name!r} takes no value: write it without '='")
            given = {spec.options[0].name: given.pop("__main__"), **given}
        options = parse_options(f"logits processor {spec.name!r}", spec.options, given)
        processors.append(spec.factory(options))
        if getattr(processors[-1], "terminal", False) and len(processors) < len(items):
            raise ConfigError(
                f"logits processor {spec.name!r} ends a chain (it picks the token), but "
                f"{', '.join(repr(n) for n, _ in items[len(processors) :])} follow it: put it last"
            )
    return ProcessorChain(processors)

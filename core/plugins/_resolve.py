"""Turn what a user gave into things: a model name or path into a folder; a controller reference (a name, a path, a
class or an instance) into a ControllerSpec; processors (chain strings, registered names with options, objects) into
a ProcessorChain."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from decoctl.errors import ConfigError, ModelLoadError, PluginError
from decoctl.importers._registry import find_registered, load_registry
from decoctl.processing import LogitsProcessor, ProcessorChain, checked_processor, processor_name
from decoctl.specs import ControllerSpec, normalise_name, parse_options

if TYPE_CHECKING:
    from decoctl.plugins._registry import PluginRegistry

__all__ = [
    "DEFAULT_MODEL",
    "LIBRARY_SUFFIXES",
    "checked_controller",
    "controller_spec_of",
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


def resolve_controller(
    reference: str | type | object, registry: PluginRegistry, *, options: Mapping[str, Any] | None = None
) -> ControllerSpec:
    """The spec of a controller given as a registered name, ``path/to/file.py:Class``, ``package.module:Class``,
    ``lib.so:name`` or ``lib.so`` (the library's controller, when it provides exactly one), a controller class (built
    with its options, as a named one is: ``controller_spec_of``) or a ready instance (used as it is for every
    generation); a ControllerSpec is taken as it is. ``options``: what the caller will pass, checked here only against
    what the reference can take (an instance takes none: it is built already; a class whose ``__init__`` takes no
    argument takes none either)."""
    if isinstance(reference, ControllerSpec):
        return reference
    if not isinstance(reference, str):
        if isinstance(reference, type):
            spec = controller_spec_of(reference, plugin=reference.__module__)
        else:
            spec = _instance_spec(reference, options)
        _check_no_options(spec, options)
        return spec
    controllers = registry.controllers()
    spec = controllers.get(normalise_name(reference))
    if spec is not None:
        return spec
    if reference.endswith(LIBRARY_SUFFIXES):
        return _library_controller(Path(reference), None)
    if ":" not in reference:
        names = ", ".join(sorted(controllers))
        not_loaded = "".join(
            f"; plugin {plugin} was not loaded: {why}" for plugin, why in sorted(registry.skipped.items())
        )
        raise PluginError(
            f"unknown controller {reference!r} (installed: {names}): install the plugin that provides it, or "
            "give file.py:Class, package.module:Class, library.so:name, library.so, a controller class or an instance"
            f"{not_loaded}"
        )
    location, _, attribute = reference.rpartition(":")
    if location.endswith(LIBRARY_SUFFIXES):
        return _library_controller(Path(location), attribute)
    spec = _python_controller(reference, location, attribute)
    _check_no_options(spec, options)
    return spec


#: what a controller class (or instance) may say about itself, read into its ControllerSpec: the spec's fields of
#: the same names (``roles_for``, ``capabilities_for``, ``check_options``, ``rows_for`` and ``scratch_for`` as static
#: methods taking the parsed options)
_CLASS_FIELDS = (
    "roles",
    "roles_for",
    "capabilities",
    "capabilities_for",
    "check_options",
    "rows_for",
    "scratch_for",
    "sampling_processors",
    "options",
)


def controller_spec_of(target: Callable[..., Any], *, plugin: str, name: str | None = None) -> ControllerSpec:
    """The ControllerSpec of a controller class (or a factory function taking the options), as a plugin would write
    it: the name (``name``, else the class's), the first line of its docstring as the summary, and the class
    attributes ``roles``, ``capabilities``, ``options`` (its Option schema), ``roles_for``, ``capabilities_for``,
    ``check_options``, ``rows_for``, ``scratch_for``, ``sampling_processors`` and ``batched`` (default: whether it has
    ``next_token``). A class is built as ``Class(options)``, the parsed options as a dict, or ``Class()`` when its
    ``__init__`` takes no argument (then it takes no options). A class without ``step`` is refused, naming it."""
    label = name or str(getattr(target, "__qualname__", type(target).__name__))
    if isinstance(target, type):
        checked_controller(target, label)
    doc = inspect.getdoc(target) or ""
    fields = _declared(target)
    factory: Callable[[dict[str, Any]], Any] = target
    if isinstance(target, type) and not _takes_options(target):
        if fields["options"]:
            raise ConfigError(
                f"controller {label}: it declares options {[o.name for o in fields['options']]} but its __init__ "
                "takes no argument to receive them: give it __init__(self, options)"
            )
        factory = _WithoutOptions(target)
    return ControllerSpec(
        name=label,
        summary=doc.splitlines()[0] if doc else f"{label} from {plugin}",
        factory=factory,
        batched=bool(getattr(target, "batched", callable(getattr(target, "next_token", None)))),
        plugin=plugin,
        **fields,
    )


def checked_controller(controller: Any, name: str) -> Any:
    """``controller`` (an object or a class) once it has the one method a controller needs, ``step(host)``;
    ConfigError naming it and the method otherwise."""
    if not callable(getattr(controller, "step", None)):
        kind = "class" if isinstance(controller, type) else "object"
        raise ConfigError(
            f"controller {name} ({kind} {getattr(controller, '__qualname__', type(controller).__name__)}) has no "
            "step(host) method: a controller needs step(host), which commits at least one token or finishes the "
            "generation (start(host), stats() and next_token(host) are optional)"
        )
    return controller


def _instance_spec(controller: object, options: Mapping[str, Any] | None) -> ControllerSpec:
    """A ready controller object as a spec whose factory gives that object for every generation (it is not built
    again, so its ``start(host)`` begins each generation afresh). It drives batched prompts one at a time: a batch
    needs a controller per prompt."""
    cls = type(controller)
    name = cls.__name__
    checked_controller(controller, name)
    if options:
        raise ConfigError(
            f"controller {name} is an instance, built already, but options {dict(options)} were given: pass the class "
            f"({name}) to have it built with them, or build the instance with them yourself"
        )
    fields = {**_declared(controller), "options": ()}
    doc = inspect.getdoc(cls) or ""
    return ControllerSpec(
        name=name,
        summary=doc.splitlines()[0] if doc else f"an instance of {name}",
        factory=lambda _options: controller,
        plugin=cls.__module__,
        **fields,
    )


def _declared(target: object) -> dict[str, Any]:
    """The ControllerSpec fields ``target`` (a class or an instance) declares as attributes (``_CLASS_FIELDS``), with
    the spec's defaults for roles, capabilities and options."""
    fields = {field: getattr(target, field) for field in _CLASS_FIELDS if getattr(target, field, None) is not None}
    fields["roles"] = tuple(fields.get("roles", ("target",)))
    fields["capabilities"] = dict(fields.get("capabilities", {}))
    fields["options"] = tuple(fields.get("options", ()))
    return fields


def _takes_options(cls: type) -> bool:
    """Whether ``cls(options)`` is how to build ``cls``: its ``__init__`` takes a positional argument."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # a signature Python cannot read (a builtin's): call it as documented
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind in positional or p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)


class _WithoutOptions:
    """Builds a controller class whose ``__init__`` takes no argument (so it takes no options)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __call__(self, options: dict[str, Any]) -> Any:
        del options  # always empty: the spec declares none, and given ones were refused (_check_no_options)
        return self.cls()


def _check_no_options(spec: ControllerSpec, options: Mapping[str, Any] | None) -> None:
    """Options given for a class whose ``__init__`` takes none: ConfigError naming the class."""
    if options and isinstance(spec.factory, _WithoutOptions):
        name = spec.factory.cls.__qualname__
        raise ConfigError(
            f"controller {name}: its __init__ takes no options, but options {dict(options)} were given: drop them, "
            "or give it __init__(self, options) and an options schema (a tuple of decoctl.Option)"
        )


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
    return controller_spec_of(target, plugin=location, name=attribute)


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


Processors: TypeAlias = str | Seq[Any] | ProcessorChain | None
"""What ``processors=`` takes: a chain string, or a list mixing chain strings, tables, (name, options) pairs and
processor objects."""


def parse_processor_chain(chain: Processors, registry: PluginRegistry) -> ProcessorChain:
    """Build a chain from ``"name=value,name=value"``, or from a list whose entries are, in any mix: chain strings
    (one or several processors), registered processors with options (``{"name": ..., **options}`` tables or
    ``(name, {options})`` pairs) and processor objects (anything ``decoctl.LogitsProcessor`` describes: an object with
    ``__call__(rows, context)``, or a plain function; transformers' through ``decoctl.from_transformers``). A
    ProcessorChain is taken as it is.

    ``name=value`` sets a processor's single main option (the first in its schema); ``name`` alone uses its
    defaults. Unknown processors, bad values and objects that are no processor raise ConfigError before generation
    starts.
    """
    if isinstance(chain, ProcessorChain):
        return chain
    if chain is None or (isinstance(chain, str | list | tuple) and not chain):
        return ProcessorChain()
    if isinstance(chain, str):
        entries: list[Any] = [chain]
    elif isinstance(chain, list | tuple):
        entries = list(chain)
    else:
        raise ConfigError(
            f"processors={processor_name(chain)!r}: give a chain string, or a list of chain strings, tables, "
            "(name, options) pairs and processor objects (a single processor object goes in a list: [processor])"
        )
    specs = registry.processors()
    processors: list[LogitsProcessor] = []
    names: list[str] = []
    for entry in entries:
        for name, given in _registered_items(entry):
            if given is None:  # a processor object
                processors.append(checked_processor(name))
                names.append(processor_name(name))
                continue
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
            names.append(spec.name)
    return ProcessorChain(processors, names=names)


def _registered_items(entry: Any) -> list[tuple[Any, dict[str, Any] | None]]:
    """(registered name, its given options) for each processor an entry of ``processors=`` names; (the object,
    None) for a processor object."""
    if isinstance(entry, str):
        items: list[tuple[Any, dict[str, Any] | None]] = []
        for item in _split_items(entry):
            name, sep, value = item.partition("=")
            items.append((name.strip(), {"__main__": value.strip()} if sep else {}))
        return items
    if isinstance(entry, Mapping):
        if "name" not in entry:
            raise ConfigError(f"processor entry {dict(entry)!r} must be a table with a 'name' key")
        return [(str(entry["name"]), {k: v for k, v in entry.items() if k != "name"})]
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], Mapping):
        return [(entry[0], dict(entry[1]))]
    return [(entry, None)]

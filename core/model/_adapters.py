"""LoRA adapters beside one base model, chosen per generation, bound into the runner's IOBinding.

A base model that takes adapters has a LoRA slot for each adapted weight: a pair of graph inputs (``A`` float[in,
rank], ``B`` float[rank, out]; the output is ``X @ W + (X @ A) @ B``) that are also initializers holding zeros, so that
the model run as it is is the base model (onnxruntime lists them as overridable initializers). An adapter is a set of
values for those slots, in onnxruntime's adapter format (``.onnx_adapter``: onnxruntime.AdapterFormat), several of
them loaded beside one base model.

onnxruntime's own way to pick an adapter per Run (``RunOptions.add_active_adapter``) feeds the slots as inputs of a
plain ``run``; decoctl runs with IOBinding over preallocated buffers, so the adapter's arrays are bound as inputs of
that binding instead, once when a generation starts (the binding keeps them for every Run after): the KV cache, the
logits and every other buffer stay bound as they are. A generation without an adapter binds zeros of rank 1, which
adds exactly nothing, so no adapter's values stay behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import onnxruntime as ort

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.logs import get_logger

if TYPE_CHECKING:
    from decoctl.model._loader import LoadedModel
    from decoctl.model.graph._lora_stacks import Stacked

__all__ = [
    "Adapter",
    "AdapterTable",
    "adapter_slots",
    "bind_adapter",
    "check_adapter",
    "read_adapter",
    "split_model_name",
    "with_adapters",
    "write_adapter",
]

log = get_logger(__name__)

#: onnxruntime's tensor type names -> numpy dtypes a slot may hold
_DTYPES: dict[str, np.dtype[Any]] = {"tensor(float)": np.dtype(np.float32), "tensor(float16)": np.dtype(np.float16)}


@attrs.frozen(kw_only=True)
class Adapter:
    """One LoRA adapter: ``parameters`` slot name -> its value (C-contiguous, kept alive while bound)."""

    name: str
    path: Path | None
    parameters: Mapping[str, np.ndarray]


@attrs.frozen(kw_only=True)
class Slot:
    """One overridable input of the base model: its type and shape (ints where fixed, names where not)."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | str | None, ...]

    def zeros(self) -> np.ndarray:
        """The base model's value: zeros, rank 1 where the rank is free."""
        return np.zeros([d if isinstance(d, int) else 1 for d in self.shape], self.dtype)


def read_adapter(path: str | Path, *, name: str | None = None) -> Adapter:
    """An adapter from onnxruntime's adapter format (``.onnx_adapter``), or ModelLoadError naming the file."""
    file = Path(path)
    if not file.is_file():
        raise ModelLoadError(f"adapter file {file} does not exist: give an .onnx_adapter file (docs/ADAPTERS.md)")
    try:
        values = ort.AdapterFormat.read_adapter(str(file)).get_parameters()
    except Exception as exc:  # onnxruntime raises its own types for a file that is not an adapter
        raise ModelLoadError(
            f"onnxruntime could not read {file} as an adapter ({type(exc).__name__}: {exc}): write it with "
            "onnxruntime.AdapterFormat (decoctl.model._adapters.write_adapter)"
        ) from exc
    # copies: value.numpy() views memory the adapter's OrtValues own, freed with them
    parameters = {key: np.array(value.numpy(), copy=True, order="C") for key, value in values.items()}
    return Adapter(name=name or file.name.removesuffix(".onnx_adapter"), path=file, parameters=parameters)


def write_adapter(path: str | Path, parameters: Mapping[str, np.ndarray]) -> Path:
    """Write ``parameters`` (slot name -> float32 or float16 array) in onnxruntime's adapter format."""
    adapter = ort.AdapterFormat()
    adapter.set_parameters(
        {key: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value)) for key, value in parameters.items()}
    )
    adapter.export_adapter(str(path))
    return Path(path)


def adapter_slots(session: ort.InferenceSession) -> dict[str, Slot]:
    """The base model's LoRA slots: its overridable initializers of a floating type."""
    return {
        arg.name: Slot(name=arg.name, dtype=_DTYPES[arg.type], shape=tuple(arg.shape))
        for arg in session.get_overridable_initializers()
        if arg.type in _DTYPES
    }


def check_adapter(adapter: Adapter, slots: Mapping[str, Slot], model: str) -> None:
    """Raise ModelLoadError where ``adapter`` does not fit the base model's slots: names it has none for, a type or a
    fixed size that differs, or a rank that differs between an A and its B."""
    if not slots:
        raise ModelLoadError(
            f"adapter {adapter.name} given, but model {model} has no LoRA slots (overridable initializers): export "
            "the base model with them (docs/ADAPTERS.md)"
        )
    unknown = sorted(set(adapter.parameters) - set(slots))
    if unknown:
        raise ModelLoadError(
            f"adapter {adapter.name} ({adapter.path}) has parameters model {model} has no slot for, {unknown[:4]}"
            f"{' ...' if len(unknown) > 4 else ''}: it was made for another base model; the slots are "
            f"{sorted(slots)[:4]}{' ...' if len(slots) > 4 else ''}"
        )
    for key, value in adapter.parameters.items():
        slot = slots[key]
        fits = value.ndim == len(slot.shape) and all(
            not isinstance(want, int) or want == got for want, got in zip(slot.shape, value.shape, strict=True)
        )
        if value.dtype != slot.dtype or not fits:
            raise ModelLoadError(
                f"adapter {adapter.name}: parameter {key} is {value.dtype}{list(value.shape)} but model {model} takes "
                f"{slot.dtype}{list(slot.shape)} there: it was made for another base model"
            )


def bind_adapter(
    bind: Callable[[str, type, list[int], int], None], slots: Mapping[str, Slot], adapter: Adapter | None
) -> list[np.ndarray]:
    """Bind ``adapter``'s values (zeros for the slots it leaves, and for every slot where ``adapter`` is None) into
    a binding through ``bind(name, dtype, shape, pointer)``; the arrays bound, which the caller keeps alive."""
    given = adapter.parameters if adapter is not None else {}
    bound = []
    for key, slot in slots.items():
        value = given.get(key)
        array = value if value is not None else slot.zeros()
        bind(key, array.dtype.type, list(array.shape), array.ctypes.data)
        bound.append(array)
    return bound


def chosen_adapter(adapters: Mapping[str, Adapter], name: str | None) -> Adapter | None:
    """The loaded adapter ``name`` (None: the base model), or ConfigError naming those loaded."""
    if name is None:
        return None
    if name not in adapters:
        raise ConfigError(
            f"adapter {name!r} is not loaded (loaded: {sorted(adapters) or 'none'}): load it with "
            "Generator(adapters={name: path}) or --adapter NAME=FILE.onnx_adapter"
        )
    return adapters[name]


@attrs.frozen(kw_only=True, eq=False)
class AdapterTable:
    """A model's LoRA slots in the stacked form (decoctl.model.graph._lora_stacks): each slot's values for every
    loaded adapter in one table, ``stacks[slot]`` [1 + len(names), in, rank] (A) or [1 + len(names), rank, out] (B),
    table 0 zeros (the base model) and table i + 1 adapter ``names[i]``, every rank zero-padded to the largest. Every
    Runner and batched step of the model binds the stacks once and feeds each row's table index in ``index_input``
    (int64[batch]) per Run."""

    index_input: str
    slots: Mapping[str, Slot]
    names: tuple[str, ...] = ()
    stacks: Mapping[str, np.ndarray] = attrs.field(factory=dict)

    @classmethod
    def base(cls, stacked: Stacked) -> AdapterTable:
        """The table of a freshly stacked model: table 0 (zeros, rank 1) only."""
        slots = {s.name: Slot(name=s.name, dtype=np.dtype(s.dtype), shape=s.shape) for s in stacked.slots}
        return cls(index_input=stacked.index, slots=slots).with_adapters([])

    def with_adapters(self, adapters: Seq[Adapter]) -> AdapterTable:
        """This model's table holding ``adapters`` (each checked against the slots before), in that order."""
        axes = {key: _rank_axis(slot) for key, slot in self.slots.items()}
        free = [v.shape[axes[k]] for a in adapters for k, v in a.parameters.items() if axes[k] >= 0]
        rank = max([1, *free])
        stacks = {}
        for key, slot in self.slots.items():
            dims = [d if isinstance(d, int) else rank for d in slot.shape]
            table = np.zeros([1 + len(adapters), *dims], slot.dtype)
            for i, adapter in enumerate(adapters, start=1):
                value = adapter.parameters.get(key)
                if value is not None:  # a slot the adapter leaves stays zero; a smaller rank is zero-padded
                    rows, columns = value.shape
                    table[i, :rows, :columns] = value
            stacks[key] = table
        return AdapterTable(
            index_input=self.index_input, slots=self.slots, names=tuple(a.name for a in adapters), stacks=stacks
        )

    def index(self, name: str | None) -> int:
        """The table of adapter ``name`` (0: None, the base model), or ConfigError naming those loaded."""
        if name is None:
            return 0
        if name not in self.names:
            raise ConfigError(
                f"adapter {name!r} is not loaded (loaded: {list(self.names) or 'none'}): load it with "
                "Generator(adapters={name: path}) or --adapter NAME=FILE.onnx_adapter"
            )
        return 1 + self.names.index(name)

    def bind(self, bind: Callable[[str, type, list[int], int], None]) -> None:
        """Bind every stack through ``bind(name, dtype, shape, pointer)`` (the arrays live as long as the table)."""
        for key, table in self.stacks.items():
            bind(key, table.dtype.type, list(table.shape), table.ctypes.data)


def _rank_axis(slot: Slot) -> int:
    """The axis of a slot's free rank (A: 1, B: 0), or -1 where both its sizes are fixed."""
    return next((i for i, d in enumerate(slot.shape) if not isinstance(d, int)), -1)


def split_model_name(name: str, served: str) -> tuple[str, str | None]:
    """A request's model name as (base, adapter): ``"base:sql"`` -> ("base", "sql"), ``"base"`` -> ("base", None);
    a name that does not start with ``served`` and a colon is kept whole."""
    if name.startswith(served + ":"):
        return served, name[len(served) + 1 :]
    return name, None


def with_adapters(model: LoadedModel, given: Mapping[str, str | Path | Adapter]) -> LoadedModel:
    """``model`` (loaded with ``lora_stacks=True``) holding the adapters ``given`` (name -> an ``.onnx_adapter`` file or
    an Adapter), each read and checked against its slots (ModelLoadError naming what does not fit), in tables 1..
    in the order given; it shares ``model``'s session."""
    if model.adapters is None:
        raise ModelLoadError(
            f"model {model.name} was loaded with its LoRA slots as exported: load it with "
            "load_model(..., lora_stacks=True) to hold adapters"
        )
    other = "a split export's prefill graph" if model.prefill is not None else None
    other = "an encoder-decoder model's first-pass decoder" if model.encoder is not None else other
    if other is not None:  # a graph of its own that runs the prompt, whose slots are not stacked
        raise ModelLoadError(
            f"model {model.name} runs prompts through {other}, which takes no adapter: load adapters on a "
            "decoder-only model exported as one graph (docs/ADAPTERS.md)"
        )
    adapters = []
    for name, source in given.items():
        adapter = source if isinstance(source, Adapter) else read_adapter(source, name=name)
        check_adapter(adapter, model.adapters.slots, model.name)
        adapters.append(attrs.evolve(adapter, name=name))
    log.debug("decoctl.adapters_loaded", model=model.name, adapters=[a.name for a in adapters])
    return attrs.evolve(model, adapters=model.adapters.with_adapters(adapters))

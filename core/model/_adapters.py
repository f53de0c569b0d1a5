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
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import onnxruntime as ort

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.logs import get_logger

__all__ = ["Adapter", "adapter_slots", "bind_adapter", "check_adapter", "read_adapter", "write_adapter"]

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

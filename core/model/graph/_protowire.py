"""Just enough of protobuf's wire format to read and splice an ONNX graph without the onnx package.

A message is a run of fields, each a key (field number << 3 | wire type) and a value. ``fields()`` walks one
message and hands back every field with the byte span it occupies, so a caller can rebuild a message by keeping
most spans verbatim (weights included, never decoded) and replacing a few. Only the wire types ONNX uses occur:
varint (0), 64-bit (1), length-delimited (2) and 32-bit (5).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

from decoctl.errors import ModelLoadError

__all__ = [
    "LENGTH_DELIMITED",
    "VARINT",
    "Field",
    "Tensor",
    "fields",
    "length_delimited",
    "packed_varints",
    "tensor",
    "varint",
    "varint_field",
]

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


@attrs.frozen(kw_only=True)
class Field:
    """One field of a message: its number, wire type, value (an int for varints, the payload bytes for
    length-delimited fields, the raw bytes for fixed-width ones) and ``raw``, the whole field as encoded."""

    number: int
    wire_type: int
    value: int | bytes
    raw: bytes

    @property
    def payload(self) -> bytes:
        if not isinstance(self.value, bytes):
            raise ModelLoadError(f"protobuf field {self.number} is a number where a message or string was expected")
        return self.value

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")

    @property
    def number_value(self) -> int:
        if not isinstance(self.value, int):
            raise ModelLoadError(f"protobuf field {self.number} holds bytes where a number was expected")
        return self.value


def fields(message: bytes) -> Iterator[Field]:
    """Every field of ``message`` in order; a truncated or malformed message raises ModelLoadError."""
    view = memoryview(message)
    at, end = 0, len(message)
    while at < end:
        start = at
        key, at = _read_varint(view, at)
        number, wire_type = key >> 3, key & 7
        value: int | bytes
        if wire_type == VARINT:
            value, at = _read_varint(view, at)
        elif wire_type == LENGTH_DELIMITED:
            size, at = _read_varint(view, at)
            if at + size > end:
                raise ModelLoadError(f"protobuf field {number} runs past the end of its message: the file is truncated")
            value, at = bytes(view[at : at + size]), at + size
        elif wire_type in (FIXED64, FIXED32):
            width = 8 if wire_type == FIXED64 else 4
            value, at = bytes(view[at : at + width]), at + width
        else:
            raise ModelLoadError(f"protobuf wire type {wire_type} (field {number}) does not occur in ONNX files")
        if number == 0 or at > end:
            raise ModelLoadError("malformed protobuf message: the file is not ONNX or is corrupt")
        yield Field(number=number, wire_type=wire_type, value=value, raw=bytes(view[start:at]))


def packed_varints(field: Field) -> list[int]:
    """The integers of a repeated varint field, packed (one length-delimited run) or not (one value)."""
    if isinstance(field.value, int):
        return [field.value]
    view, at, values = memoryview(field.value), 0, []
    while at < len(view):
        value, at = _read_varint(view, at)
        values.append(value)
    return values


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (negative numbers as their 64-bit two's complement, as int64 fields are)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def varint_field(number: int, value: int) -> bytes:
    return varint(number << 3 | VARINT) + varint(value)


def length_delimited(number: int, payload: bytes | Iterable[bytes]) -> bytes:
    body = payload if isinstance(payload, bytes) else b"".join(payload)
    return varint(number << 3 | LENGTH_DELIMITED) + varint(len(body)) + body


def _read_varint(view: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(view) or shift > 63:
            raise ModelLoadError("malformed protobuf varint: the file is not ONNX or is truncated")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


# TensorProto.dims / data_type / float_data / int64_data / name / raw_data / external_data; StringStringEntryProto
# key / value (field numbers from onnx.proto)
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_FLOAT_DATA, _TENSOR_INT64_DATA = 1, 2, 4, 7
_TENSOR_NAME, _TENSOR_RAW_DATA, _TENSOR_EXTERNAL_DATA = 8, 9, 13
_ENTRY_KEY, _ENTRY_VALUE = 1, 2


@attrs.frozen(kw_only=True)
class Tensor:
    """A TensorProto's fields as encoded: ``raw`` (raw_data), ``int64s`` / ``floats`` (the typed fields, packed
    or not), ``external`` (external_data's key -> value: location, offset, length)."""

    name: str
    dims: tuple[int, ...]
    data_type: int
    raw: bytes | None
    int64s: tuple[int, ...]
    floats: bytes
    external: dict[str, str]


def tensor(payload: bytes) -> Tensor:
    """Read a TensorProto message."""
    dims: list[int] = []
    name, data_type, raw, floats = "", 0, None, b""
    int64s: list[int] = []
    external: dict[str, str] = {}
    for field in fields(payload):
        if field.number == _TENSOR_DIMS:
            dims.extend(packed_varints(field))
        elif field.number == _TENSOR_DATA_TYPE:
            data_type = field.number_value
        elif field.number == _TENSOR_NAME:
            name = field.text
        elif field.number == _TENSOR_RAW_DATA:
            raw = field.payload
        elif field.number == _TENSOR_INT64_DATA:
            int64s.extend(v - (1 << 64) if v >= 1 << 63 else v for v in packed_varints(field))
        elif field.number == _TENSOR_FLOAT_DATA:
            floats += field.payload  # packed, or one fixed32 value
        elif field.number == _TENSOR_EXTERNAL_DATA:
            entry = {part.number: part.text for part in fields(field.payload)}
            external[entry.get(_ENTRY_KEY, "")] = entry.get(_ENTRY_VALUE, "")
    return Tensor(
        name=name,
        dims=tuple(dims),
        data_type=data_type,
        raw=raw,
        int64s=tuple(int64s),
        floats=floats,
        external=external,
    )

"""A vision-language model's parts in front of its decoder: images -> pixel values (the folder's
preprocessor_config.json), the vision encoder (pixel values -> image features, once per image per generation) and
the embedding stage (token ids and image features -> the decoder's ``inputs_embeds``).

The embedding graph runs only for forwards that place image features (the prompt's image tokens). Every other
forward (decode steps, drafts, verification) looks its tokens up in the token embedding table read once from that
graph's own initializer, so a decode step stays one Run of the decoder and copies no image features. A token equal
to the image token that no image fills (one the model generates) takes its table row, as transformers does.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import onnxruntime as ort

from decoctl.errors import CapabilityError, ConfigError, ModelLoadError, SequenceError
from decoctl.model._gemma3_vision import Gemma3Marks
from decoctl.model._image_blocks import BidirectionalImages
from decoctl.model._image_processor import MAX_PIXELS, ImagePreprocessor
from decoctl.model._qwen_vl import QwenVision
from decoctl.model.graph import _protowire as pw

__all__ = ["ImageFeatures", "ImagePreprocessor", "TokenEmbedder", "VisionParts", "read_embedding_table"]

# ModelProto.graph; GraphProto.node / initializer; NodeProto.input / op_type; TensorProto's float types (field
# numbers and enum values from onnx.proto)
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER = 1, 5
_NODE_INPUT, _NODE_OP_TYPE = 1, 4
_FLOAT, _FLOAT16 = 1, 10


@attrs.define
class ImageFeatures:
    """The features of one generation's images in prompt order, float32[rows, hidden], and how many rows each
    image gave (one image token each)."""

    rows: np.ndarray
    per_image: tuple[int, ...]
    #: each image's patch grid (t, h, w), for a family whose positions follow it (Qwen2.5-VL's M-RoPE); else ()
    grids: tuple[tuple[int, int, int], ...] = ()


def read_embedding_table(path: Path, input_ids: str) -> np.ndarray | None:
    """The token embedding table float32[vocab, hidden] of an embedding graph: the initializer a Gather reads
    at ``input_ids``, inline or in external data; None where the graph keeps it some other way."""
    model = path.read_bytes()
    graphs = [f for f in pw.fields(model) if f.number == _MODEL_GRAPH]
    if len(graphs) != 1:
        return None
    graph = list(pw.fields(graphs[0].payload))
    tables = []
    for field in graph:
        if field.number != _GRAPH_NODE:
            continue
        parts = list(pw.fields(field.payload))
        op = next((p.text for p in parts if p.number == _NODE_OP_TYPE), "")
        inputs = [p.text for p in parts if p.number == _NODE_INPUT]
        if op == "Gather" and len(inputs) == 2 and inputs[1] == input_ids:
            tables.append(inputs[0])
    for field in graph:
        if field.number == _GRAPH_INITIALIZER:
            tensor = _tensor(field.payload, path.parent)
            if tensor is not None and tensor[0] in tables and tensor[1].ndim == 2:
                return tensor[1]
    return None


def _tensor(payload: bytes, folder: Path) -> tuple[str, np.ndarray] | None:
    read = pw.tensor(payload)
    if read.data_type not in (_FLOAT, _FLOAT16):
        return None
    dtype = np.dtype("<f4") if read.data_type == _FLOAT else np.dtype("<f2")
    data = read.raw
    if read.external:
        offset, length = int(read.external.get("offset", 0)), int(read.external.get("length", 0))
        with open(folder / read.external["location"], "rb") as source:
            source.seek(offset)
            data = source.read(length or int(np.prod(read.dims)) * dtype.itemsize)
    if data is not None:
        array = np.frombuffer(data, dtype)
    elif read.floats:
        array = np.frombuffer(read.floats, "<f4")
    else:
        return None
    return read.name, array.astype(np.float32).reshape(read.dims)


class TokenEmbedder:
    """The decoder's inputs_embeds for fed tokens: the embedding graph where image features go in, the table
    elsewhere (see the module docstring). ``graph_runs`` counts the embedding graph's Runs."""

    def __init__(
        self,
        session: ort.InferenceSession,
        table: np.ndarray | None,
        *,
        image_token: int,
        ids: str,
        features: str,
        output: str,
    ) -> None:
        self._session = session
        self.table = table
        self.image_token = image_token
        self._names = (ids, features, output)
        self.hidden = int(table.shape[1]) if table is not None else _last_dim(session, output)
        self.graph_runs = 0

    def embed(self, tokens: np.ndarray, features: np.ndarray | None) -> np.ndarray:
        """float32[rows, n, hidden] for int64[rows, n] ``tokens``; ``features`` (float32[m, hidden]): the rows for
        the image tokens among them, in order (None or m = 0: no image goes in)."""
        if (features is None or not len(features)) and self.table is not None:
            return self.table[tokens]
        self.graph_runs += 1
        return self._graph(tokens, features)

    def check_table(self, probes: int = 16) -> None:
        """Keep the table only where it gives the graph's own output for text tokens (``probes`` of them, spread
        over the vocabulary); a graph that does more than look its tokens up (a scale, a norm) runs every forward."""
        if self.table is None:
            return
        ids = np.unique(np.linspace(0, len(self.table) - 1, probes).astype(np.int64))
        ids = ids[ids != self.image_token][None, :]
        if not np.allclose(self.table[ids], self._graph(ids, None), atol=1e-6):
            self.table = None

    def _graph(self, tokens: np.ndarray, features: np.ndarray | None) -> np.ndarray:
        ids, feature_name, output = self._names
        rows = features if features is not None else np.zeros((0, self.hidden), np.float32)
        return self._session.run([output], {ids: tokens, feature_name: rows})[0].astype(np.float32, copy=False)


def _last_dim(session: ort.InferenceSession, name: str) -> int:
    shape = next(o.shape for o in session.get_outputs() if o.name == name)
    if not isinstance(shape[-1], int):
        raise ModelLoadError(f"the embedding graph's {name} has no fixed width ({shape}): export it with one")
    return shape[-1]


class VisionParts:
    """The vision encoder, the embedding stage and the image preprocessor of a vision-language model.
    ``encoder_runs`` counts the vision encoder's Runs (one per image per generation)."""

    def __init__(
        self,
        *,
        vision: ort.InferenceSession,
        pixel_input: str,
        feature_output: str,
        embedder: TokenEmbedder,
        preprocessor: ImagePreprocessor,
        image_token: int,
        qwen: QwenVision | None = None,
        marks: Gemma3Marks | None = None,
        blocks: BidirectionalImages | None = None,
    ) -> None:
        self.vision = vision
        #: Gemma 3's image marks, expanded in the prompt's text (decoctl.model._gemma3_vision); None: expand() the ids
        self.marks = marks
        #: how an image's tokens attend to each other both ways (decoctl.model._image_blocks); None: causally
        self.blocks = blocks
        #: Qwen2.5-VL's patching and vision indices (decoctl.model._qwen_vl), None for a fixed-size family
        self.qwen = qwen
        self.pixel_input = pixel_input
        self.feature_output = feature_output
        self.embedder = embedder
        self.preprocessor = preprocessor
        self.image_token = image_token
        self.encoder_runs = 0

    def encode(self, images: Sequence[Any], *, max_pixels: int = MAX_PIXELS) -> ImageFeatures:
        """Run the vision encoder once per image; the features of every image, in order. ConfigError for an image
        of more than ``max_pixels`` pixels (as given or once resized), before it is decoded where its header says."""
        if not images:
            return ImageFeatures(rows=np.zeros((0, self.embedder.hidden), np.float32), per_image=())
        parts, grids = [], []
        for index, pixels in enumerate(self.preprocessor.each(images, max_pixels=max_pixels)):
            self.encoder_runs += 1
            if self.qwen is not None:
                feeds, grid = self.qwen.image(pixels)
                grids.append(grid)
            else:
                # one image, or with pan-and-scan the whole image and its crops: float32[views, 3, height, width]
                feeds = {self.pixel_input: pixels if pixels.ndim == 4 else pixels[None]}
            try:
                out = self.vision.run([self.feature_output], feeds)[0]
            except Exception as exc:  # onnxruntime's own error types
                raise ModelLoadError(
                    f"the vision encoder fails on image {index} (pixel values {feeds[self.pixel_input].shape}): "
                    f"{exc}; check preprocessor_config.json's size against the encoder's input"
                ) from exc
            parts.append(np.asarray(out, np.float32).reshape(-1, out.shape[-1]))
        return ImageFeatures(rows=np.concatenate(parts), per_image=tuple(len(p) for p in parts), grids=tuple(grids))

    def prompt_ids(
        self, tokenizer: Any, text: str, ids: Sequence[int], features: ImageFeatures, *, add_special_tokens: bool
    ) -> list[int]:
        """The prompt's token ids with each image's place expanded for its features: in the text, encoded again
        (``add_special_tokens`` as the prompt's ``ids`` were encoded), where the family's marks expand in the text
        (Gemma 3: ``marks``); in the ids otherwise (expand). ConfigError where the marks and images differ in number."""
        if self.marks is None:
            return self.expand(ids, features)
        expanded: list[int] = tokenizer.encode(
            self.marks.expand(text, features.per_image), add_special_tokens=add_special_tokens
        )
        return expanded

    def expand(self, ids: Sequence[int], features: ImageFeatures) -> list[int]:
        """The prompt's token ids with each image token expanded to its image's rows of image tokens (a prompt
        holds one image token per image, where the image goes). Raises ConfigError where the counts differ, and
        CapabilityError for a family whose marks expand in the text (``marks``: prompt_ids expands them)."""
        if self.marks is not None:
            raise CapabilityError(
                f"this model's image marks ({self.marks.boi}) expand in the prompt's text, before it is tokenized, "
                "as its processor expands them: expand them with prompt_ids(), which takes the text"
            )
        marks = [i for i, token in enumerate(ids) if token == self.image_token]
        if len(marks) != len(features.per_image):
            raise ConfigError(
                f"the prompt holds {len(marks)} image token(s) (id {self.image_token}) for {len(features.per_image)} "
                "image(s): put one image token in the prompt where each image goes, one per image given"
            )
        if self.qwen is not None:  # M-RoPE: transformers reads one run of image tokens as one image
            for index, (mark, following) in enumerate(itertools.pairwise(marks)):
                if following == mark + 1:
                    raise ConfigError(
                        f"images {index} and {index + 1} stand next to each other in the prompt (token {mark}): put "
                        "text between them (Qwen's <|vision_end|><|vision_start|>), as transformers needs"
                    )
        out: list[int] = []
        last = 0
        for mark, rows in zip(marks, features.per_image, strict=True):
            out.extend(ids[last:mark])
            out.extend([self.image_token] * rows)
            last = mark + 1
        out.extend(ids[last:])
        return out


def no_images(model_name: str) -> CapabilityError:
    return CapabilityError(
        f"images were given but model {model_name} has no vision encoder: use a vision-language model (its folder "
        "names a vision and an embedding graph), or leave the images out"
    )


def too_many_image_tokens(model_name: str, fed: int, held: int) -> SequenceError:
    return SequenceError(
        f"model {model_name}: {fed} image token positions of the prompt need features but its images gave {held} "
        "rows: give the images the prompt's image tokens stand for"
    )

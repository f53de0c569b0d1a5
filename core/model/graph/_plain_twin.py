"""A tree-enabled model's plain twin, derived once and cached: what onnxruntime-genai and a raw onnxruntime loop run.

A model with tree inputs (``decoctl models enable-tree``, the bundled demo model among them) takes
``position_ids`` and ``attention_bias``, which onnxruntime-genai does not feed. ``plain_twin(folder)`` hands back
a folder with the same weights and without those inputs (decoctl.model.graph.disable_tree: the graph edited
without the onnx package, every other file linked), written once under the user's cache directory,
``$XDG_CACHE_HOME/decoctl/plain/<name>-<key>`` (``~/.cache/...`` when XDG_CACHE_HOME is unset), where the key
hashes the source folder's path and each file's size and modification time, so an edited source gets a new twin.
A twin appears whole or not at all (written in a temporary folder, then renamed).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.logs import get_logger
from decoctl.model.graph._transform import GENAI_CONFIG, disable_tree, has_tree_inputs

__all__ = ["cache_dir", "plain_twin"]

log = get_logger(__name__)

#: part of every key: a change to how twins are written gives new ones instead of reusing old ones
_FORMAT = "1"
#: graph files larger than this hold their weights: a twin would copy them, so none is made
_MAX_GRAPH_BYTES = 256 << 20


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/decoctl``, or ``~/.cache/decoctl`` when XDG_CACHE_HOME is unset or empty."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "decoctl"


def plain_twin(folder: str | Path, *, graph_file: str = "model.onnx") -> Path:
    """``folder`` itself when its graph has no tree inputs, else its cached plain twin (derived on first use).

    :param folder: an onnxruntime-genai layout model folder.
    :param graph_file: the decoder's graph file in it (genai_config.json's ``model.decoder.filename``).
    :raises ConfigError: the twin cannot be written to the cache directory, or the graph file holds the weights.
    :raises ModelLoadError: the graph is not readable, or reads its tree inputs where they cannot be removed.
    """
    source = Path(folder).expanduser().resolve()
    graph_path = source / graph_file
    try:
        size = graph_path.stat().st_size
        if size > _MAX_GRAPH_BYTES:
            raise ConfigError(
                f"{graph_path} holds its weights ({size >> 20} MiB), so a plain twin without tree inputs would "
                "copy them: export the model with external data, or give the contender a model without tree "
                "inputs (model=PATH)"
            )
        graph = graph_path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read {graph_path} ({exc.strerror}): the model folder is incomplete") from exc
    if not has_tree_inputs(graph):
        return source
    target = cache_dir() / "plain" / f"{source.name}-{_key(source)}"
    if (target / GENAI_CONFIG).is_file():
        return target
    try:
        disable_tree(source, target)
    except (ConfigError, OSError) as exc:
        if (target / GENAI_CONFIG).is_file():  # another process wrote it first
            return target
        raise ConfigError(
            f"could not write the plain twin of {source} to {target} ({exc}): set XDG_CACHE_HOME to a writable "
            "folder, or give the contender a model without tree inputs (model=PATH)"
        ) from exc
    log.info("decoctl.plain_twin_derived", source=str(source), twin=str(target))
    return target


def _key(source: Path) -> str:
    digest = hashlib.sha256(f"{_FORMAT}\0{source}".encode())
    for entry in sorted(source.iterdir()):
        stat = entry.stat()
        digest.update(f"\0{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]

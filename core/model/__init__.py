"""The ONNX model runtime: folder layouts, sessions, KV caches, tokenizer. Knows nothing of the host."""

from decoctl.model.capabilities import Capabilities
from decoctl.model.loader import LoadedModel, default_threads, load_model
from decoctl.model.runner import Runner, RunOutputs
from decoctl.model.spec import ModelSpec, detect_layout
from decoctl.model.tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = [
    "Capabilities",
    "IncrementalDetokenizer",
    "LoadedModel",
    "ModelSpec",
    "RunOutputs",
    "Runner",
    "Tokenizer",
    "default_threads",
    "detect_layout",
    "load_model",
]

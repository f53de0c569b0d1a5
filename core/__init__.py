"""decoctl: decode controllers for ONNX causal language models.

A small host runs the model and exposes step primitives; decoding strategies are plugins.
"""

from decoctl.controllers import Controller, Greedy, Sample, sample_from_logits
from decoctl.errors import (
    AbiError,
    CapabilityError,
    ConfigError,
    ControllerError,
    DecoctlError,
    GenerationError,
    GeneratorInUseError,
    ModelLoadError,
    PluginError,
    SequenceError,
)
from decoctl.generate import GenerationResult, GenerationStats, Generator, generate, stream
from decoctl.host import Host, Sequence
from decoctl.plugins import PluginRegistry, hookimpl
from decoctl.processing import LogitsProcessor, ProcessContext, ProcessorChain
from decoctl.specs import ControllerSpec, ModelBundle, Option, ProcessorSpec

__version__ = "0.1.0"

__all__ = [
    "AbiError",
    "CapabilityError",
    "ConfigError",
    "Controller",
    "ControllerError",
    "ControllerSpec",
    "DecoctlError",
    "GenerationError",
    "GenerationResult",
    "GenerationStats",
    "Generator",
    "GeneratorInUseError",
    "Greedy",
    "Host",
    "LogitsProcessor",
    "ModelBundle",
    "ModelLoadError",
    "Option",
    "PluginError",
    "PluginRegistry",
    "ProcessContext",
    "ProcessorChain",
    "ProcessorSpec",
    "Sample",
    "Sequence",
    "SequenceError",
    "generate",
    "hookimpl",
    "sample_from_logits",
    "stream",
]

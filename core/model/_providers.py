"""Execution providers: which onnxruntime provider runs a role's sessions, with its options, checked at load.

A provider is named short (``cpu``, ``openvino``, ``cuda``) or as onnxruntime names it
(``OpenVINOExecutionProvider``), with options after a colon: ``openvino:device_type=CPU,num_of_threads=1``. On the
command line and in a run file a role may be named first: ``draft=cpu``. A provider this onnxruntime build does not
carry is refused by name with the package that brings it; onnxruntime's own habit of retrying a session on the CPU
provider when the chosen one fails (printing to stdout) is turned off, so a model never runs elsewhere than asked.
Nodes a provider has no kernel for still run on the CPU provider inside the same session: that is onnxruntime's
graph partitioning, and ``decoctl.model_loaded`` logs the providers a session holds.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import onnxruntime as ort

from decoctl.errors import ConfigError, DecoctlError, ModelLoadError

__all__ = ["CPU", "Provider", "ProviderChoice", "SessionWithoutFallback", "add_provider_argument", "providers_by_role"]

#: short name -> onnxruntime's name
SHORT_NAMES = {
    "cpu": "CPUExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "dml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "qnn": "QNNExecutionProvider",
}
#: onnxruntime's name -> the package whose onnxruntime build carries it (each replaces the plain onnxruntime)
PACKAGES = {
    "OpenVINOExecutionProvider": "onnxruntime-openvino",
    "CUDAExecutionProvider": "onnxruntime-gpu",
    "TensorrtExecutionProvider": "onnxruntime-gpu",
    "DmlExecutionProvider": "onnxruntime-directml",
    "CoreMLExecutionProvider": "onnxruntime (its macOS build)",
    "QNNExecutionProvider": "onnxruntime-qnn",
}


def _options(given: Mapping[str, object]) -> dict[str, str]:
    """onnxruntime takes provider options as strings: numbers and booleans are written as it reads them."""
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in sorted(given.items())}


@attrs.frozen(kw_only=True)
class Provider:
    """One execution provider with its options (onnxruntime's provider options, passed through as strings)."""

    name: str = "CPUExecutionProvider"
    options: Mapping[str, str] = attrs.field(factory=dict, converter=_options)

    @classmethod
    def parse(cls, text: str | Provider) -> Provider:
        """``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE`` (NAME short or onnxruntime's), or a Provider as it is."""
        if isinstance(text, Provider):
            return text
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"provider {text!r} is not a provider name: give e.g. cpu, openvino or cuda")
        head, _, tail = text.partition(":")
        options: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in tail.split(","))):
            key, equals, value = item.partition("=")
            if not equals or not key.strip():
                raise ConfigError(
                    f"provider {text!r}: option {item!r} is not KEY=VALUE (e.g. openvino:device_type=CPU)"
                )
            options[key.strip()] = value.strip()
        return cls(name=_full_name(head.strip()), options=options)

    @property
    def short(self) -> str:
        """The short name where there is one (``openvino``), else onnxruntime's."""
        return next((short for short, full in SHORT_NAMES.items() if full == self.name), self.name)

    @property
    def takes_logit_rows(self) -> bool:
        """Whether the graph may pick the rows its LM head computes at run time (decoctl.model.graph._logit_rows):
        OpenVINO's provider fixes that output's shape when it compiles and fails the forward, so only the CPU
        provider, where it is tested, gets the rewrite; elsewhere every row's logits are computed."""
        return self.name == CPU.name

    def check_installed(self) -> None:
        """Raise ConfigError naming the package to install where this onnxruntime build lacks the provider."""
        available = ort.get_available_providers()
        if self.name in available:
            return
        package = PACKAGES.get(self.name, "an onnxruntime build that carries it")
        raise ConfigError(
            f"execution provider {self.short} ({self.name}) is not in this onnxruntime (it has {available}): "
            f"install {package} in place of onnxruntime (pip uninstall onnxruntime; pip install {package})"
        )

    def session_providers(self) -> list[Any]:
        """onnxruntime's ``providers=`` argument: this provider, then the CPU provider for the nodes it leaves."""
        if self.name == CPU.name:
            if self.options:
                raise ConfigError(
                    f"the CPU provider takes no options through decoctl (given {sorted(self.options)}): set threads "
                    "with --threads / threads=, and remove the options"
                )
            return [CPU.name]
        return [(self.name, dict(self.options)), CPU.name]

    def check_session(self, session: ort.InferenceSession, file: object) -> None:
        """Raise ModelLoadError where the session does not hold this provider (onnxruntime dropped it)."""
        if self.name not in session.get_providers():
            raise ModelLoadError(
                f"{file}: onnxruntime opened the session on {session.get_providers()}, not on {self.name}: the "
                "provider could not take this model; choose another provider"
            )

    def refused(self, exc: Exception, file: object) -> DecoctlError | None:
        """The error to raise where onnxruntime refused this provider's options, or a graph feature this build of
        onnxruntime lacks (ring caches), naming it; None where it is neither."""
        text = str(exc)
        if "sliding_window_cache" in text:
            return ModelLoadError(
                f"{file} keeps ring caches (GroupQueryAttention's sliding_window_cache), which onnxruntime "
                f"{ort.__version__} with {self.short} does not know: export the model again without "
                "windowed_kv_cache, or run it with an onnxruntime that has ring caches (the CPU provider of this one "
                "does where it loads)"
            )
        if self.name == CPU.name or not any(w in text for w in ("option", "Option")):
            return None
        return ConfigError(
            f"{file}: execution provider {self.short} refused its options {dict(self.options)}: "
            f"{text.strip().splitlines()[-1]}; fix or remove the option (see the provider's documentation)"
        )


#: the default: onnxruntime's CPU provider
CPU = Provider()


class SessionWithoutFallback(ort.InferenceSession):
    """onnxruntime's InferenceSession without its fallback: where the chosen provider fails to load or run,
    onnxruntime would print to stdout and retry on the CPU provider; decoctl raises instead (no silent fallback)."""

    @property
    def _enable_fallback(self) -> bool:
        return False

    @_enable_fallback.setter
    def _enable_fallback(self, value: bool) -> None:
        del value  # onnxruntime sets it on every session; it stays off here


#: what a Generator, a run file or a command line gives: one provider, role -> provider, or ``[ROLE=]PROVIDER``s
ProviderChoice = str | Provider | Iterable[str | Provider] | Mapping[str, str | Provider] | None


def providers_by_role(given: ProviderChoice, roles: Iterable[str]) -> dict[str, Provider]:
    """Role -> Provider from a provider for every role, a mapping role -> provider, or a list of ``[ROLE=]PROVIDER``
    (a bare one for every role, a named role's overriding it). Every role gets one; CPU where none is given."""
    roles = list(roles)
    chosen = dict.fromkeys(roles, CPU)
    if given is None:
        return chosen
    if isinstance(given, (str, Provider)):
        given = [given]
    items: list[tuple[str | None, str | Provider]]
    items = list(given.items()) if isinstance(given, Mapping) else [_role_and_provider(item) for item in given]
    for role, provider in sorted(items, key=lambda item: item[0] is not None):  # bare ones first
        if role is not None and role not in chosen:
            raise ConfigError(f"provider for role {role!r}, but the roles are {roles}: name one of them")
        for name in [role] if role is not None else roles:
            chosen[name] = Provider.parse(provider)
    return chosen


def _role_and_provider(item: str | Provider) -> tuple[str | None, str | Provider]:
    if isinstance(item, Provider):
        return None, item
    head = item.partition(":")[0]
    if "=" in head:
        role, _, rest = item.partition("=")
        return role.strip(), rest
    return None, item


def _full_name(name: str) -> str:
    full = SHORT_NAMES.get(name.lower(), name)
    if full not in SHORT_NAMES.values() and not full.endswith("ExecutionProvider"):
        raise ConfigError(
            f"provider {name!r} is not a provider name: give one of {sorted(SHORT_NAMES)} or onnxruntime's name "
            "(e.g. OpenVINOExecutionProvider)"
        )
    return full


def add_provider_argument(parser: argparse.ArgumentParser) -> None:
    """``--provider`` (generate, serve, chat, bench): the execution provider, per role where a role is named."""
    parser.add_argument(
        "--provider",
        action="append",
        default=[],
        metavar="[ROLE=]NAME[:KEY=VALUE,...]",
        help="execution provider (cpu, openvino, cuda, or onnxruntime's name) with its options, for every role or "
        "the one named (repeatable; default cpu), e.g. --provider openvino:num_of_threads=1 --provider draft=cpu",
    )

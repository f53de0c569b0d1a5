"""What an importer needs installed, and the one error that says exactly what to pip install.

The conversion tools are an optional extra (``decoctl[import]``), never runtime dependencies, and nothing is
installed behind the user's back. torch is left out of the extra on purpose: which build fits (CPU or CUDA) is
the user's choice, so it gets its own command.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import metadata

import attrs

from decoctl.errors import ConfigError

__all__ = ["EXTRA", "TORCH", "Requirement", "check_requirements"]

EXTRA = "decoctl[import]"


@attrs.frozen(kw_only=True)
class Requirement:
    """A distribution (as pip names it) and the oldest major.minor version that works."""

    distribution: str
    minimum: tuple[int, ...] = ()

    @property
    def pip(self) -> str:
        return f"{self.distribution}>={'.'.join(map(str, self.minimum))}" if self.minimum else self.distribution


TORCH = Requirement(distribution="torch", minimum=(2, 4))
# the torch this project converts and tests with (any torch >= TORCH.minimum works)
TORCH_PIN = "2.13.0"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_requirements(
    requirements: Sequence[Requirement],
    *,
    what: str,
    version: Callable[[str], str] = metadata.version,
) -> None:
    """Raise ConfigError naming every missing or too-old distribution and the exact pip commands to fix it.

    :param requirements: what the step needs, torch included when it needs torch.
    :param what: the thing being done, for the message ("importing gemma3-270m").
    :param version: the installed version of a distribution (``importlib.metadata.version``; tests swap it).
    """
    problems: list[str] = []
    torch_missing = False
    extra_missing = False
    for requirement in requirements:
        try:
            installed = version(requirement.distribution)
        except metadata.PackageNotFoundError:
            problems.append(f"{requirement.distribution} is not installed")
        else:
            if _version_tuple(installed) >= requirement.minimum:
                continue
            problems.append(f"{requirement.distribution} {installed} is too old (need {requirement.pip})")
        if requirement.distribution == TORCH.distribution:
            torch_missing = True
        else:
            extra_missing = True
    if not problems:
        return
    commands = []
    if torch_missing:
        commands.append(
            f"pip install 'torch=={TORCH_PIN}'  (torch is not part of {EXTRA}: install the build for your "
            "machine; the CPU build is enough)"
        )
    if extra_missing:
        commands.append(f"pip install '{EXTRA}'")
    raise ConfigError(
        f"{what} needs the conversion tools, and {'; '.join(problems)}. decoctl installs nothing by itself; "
        "run:\n  " + "\n  ".join(commands)
    )

"""The built distributions (make dist) against the source tree: every module and every file read at run time is in
its wheel, the sdist carries what builds the wheel, the tags say what the wheel needs, and each plugin states the
decoctl versions it works with. DECOCTL_DIST names the folder (make test-installed sets it); without it, the
checkout's dist/ when make dist has filled it."""

from __future__ import annotations

import email.parser
import os
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import decoctl

ROOT = Path(__file__).resolve().parents[1]
DIST = Path(os.environ.get("DECOCTL_DIST") or ROOT / "dist")
PLUGINS = sorted(path.parent for path in (ROOT / "plugins").glob("*/pyproject.toml"))

pytestmark = pytest.mark.skipif(
    not (DIST / ".built").exists(), reason=f"no distributions built in {DIST}: run make dist (or make test-installed)"
)


def _sources(folder: Path) -> set[str]:
    """Every file under ``folder`` that a build takes (not caches, compiled leftovers or build metadata), relative."""
    return {
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and not any(part.endswith(".egg-info") for part in path.parts)
        and path.suffix not in (".so", ".pyc")
    }


def _wheel(distribution: str) -> Path:
    wheels = sorted(DIST.glob(f"{distribution}-*.whl"))
    assert len(wheels) == 1, f"expected one {distribution} wheel in {DIST}, found {[w.name for w in wheels]}"
    return wheels[0]


def _wheel_files(distribution: str) -> set[str]:
    with zipfile.ZipFile(_wheel(distribution)) as wheel:
        return {name for name in wheel.namelist() if ".dist-info/" not in name}


def _wheel_metadata(distribution: str, member: str) -> email.message.Message:
    wheel = _wheel(distribution)
    version = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(f"{distribution}-{version}.dist-info/{member}").decode()
    return email.parser.Parser().parsestr(text)


def test_decoctls_wheel_holds_every_module_and_file_of_core() -> None:
    expected = {f"decoctl/{name}" for name in _sources(ROOT / "core")}
    files = _wheel_files("decoctl")
    assert expected - files == set()
    # what is read at run time beside the code, by name, so that a glob that matches nothing fails here too
    for data in ("decoctl/py.typed", "decoctl/serve/page/index.html", "decoctl/abi/include/decoctl.h"):
        assert data in files
    assert any(name.startswith("decoctl/_abi.") and name.endswith(".so") for name in files), "no compiled bridge"


def test_the_installed_header_is_the_abi_contract() -> None:
    with zipfile.ZipFile(_wheel("decoctl")) as wheel:
        shipped = wheel.read("decoctl/abi/include/decoctl.h")
    assert shipped == (ROOT / "abi" / "decoctl.h").read_bytes()


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.name for p in PLUGINS])
def test_each_plugins_wheel_holds_every_file_of_its_package(plugin: Path) -> None:
    (package,) = (p for p in plugin.iterdir() if p.is_dir() and p.name.startswith("decoctl_") and "." not in p.name)
    expected = {f"{package.name}/{name}" for name in _sources(package)}
    assert expected - _wheel_files(package.name) == set()


def test_decoctls_wheel_is_tagged_for_the_stable_abi_of_its_platform() -> None:
    tags = _wheel_metadata("decoctl", "WHEEL").get_all("Tag")
    assert tags and all(tag.startswith("cp311-abi3-") for tag in tags)
    for plugin in PLUGINS:
        name = canonicalize_name(plugin.name).replace("-", "_")
        assert _wheel_metadata(f"decoctl_{name}", "WHEEL").get_all("Tag") == ["py3-none-any"]


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.name for p in PLUGINS])
def test_each_plugin_states_the_decoctl_versions_it_works_with_and_admits_this_one(plugin: Path) -> None:
    name = canonicalize_name(plugin.name).replace("-", "_")
    requires = _wheel_metadata(f"decoctl_{name}", "METADATA").get_all("Requires-Dist") or []
    (decoctl_requirement,) = (
        r for r in map(Requirement, requires) if canonicalize_name(r.name) == "decoctl" and r.marker is None
    )
    assert decoctl_requirement.specifier, f"{plugin.name} requires decoctl without saying which versions"
    assert decoctl_requirement.specifier.contains(decoctl.__version__)


def test_decoctls_sdist_carries_what_builds_its_wheel() -> None:
    (sdist,) = DIST.glob("decoctl-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in ("setup.py", "pyproject.toml", "abi/build_bridge.py", "abi/decoctl.h", "core/abi/include/decoctl.h"):
        assert needed in names

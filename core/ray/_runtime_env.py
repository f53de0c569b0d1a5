"""What Ray's workers run decoctl from: the built wheels of decoctl and of the plugin distributions in use, shipped
through Ray's runtime environment, so that a node needs Ray and nothing of decoctl's.

How the wheels reach a worker. Each wheel is unpacked here as pip would install it (its RECORD checked) and every
top-level entry (``decoctl/``, ``decoctl-0.1.0.dist-info/``, ...) becomes a ``py_modules`` directory: Ray zips and
uploads it once to the cluster's GCS under a name that is the hash of its contents, each node downloads and unpacks
it into its runtime resources folder, and the worker finds it first on its path (its entry points too, so the worker's
plugins are the driver's). What the wheels require from elsewhere (onnxruntime, numpy, tokenizers, ...) goes into the
``pip`` field with the wheels' own specifiers: Ray installs those a node lacks into a virtualenv over the node's own
packages. Ray's other ways fit worse: a ``.whl`` in ``py_modules`` is installed with ``pip install --target``, which
installs every dependency again and looks for a plugin's ``decoctl`` on the package index, under a name that is
the wheel's file name rather than its contents (a rebuilt wheel of the same version would not replace the one a
running cluster has); wheel paths in ``pip`` must exist on every node, and a version already installed there would be
kept in place of the wheel.

Where the wheels come from: the folder given (``wheels=``, ``--ray-wheels DIR`` or ``DECOCTL_RAY_WHEELS``), else the
wheel file each distribution was installed from (its direct_url.json), else a wheel built from the source folder of
an editable or folder install (``pip wheel --no-deps``). Each must be of the version installed here; otherwise the
run is refused before anything starts, naming the flag that fixes it.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from email.parser import HeaderParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import attrs
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from decoctl.errors import ConfigError, DecoctlError
from decoctl.logs import get_logger

__all__ = [
    "WHEELS_ENV",
    "Wheel",
    "distributions_in_use",
    "find_wheels",
    "requirements",
    "setup_error",
    "unpack",
    "worker_runtime_env",
]

log = get_logger(__name__)

#: the environment variable naming the folder of wheels, where no folder is given
WHEELS_ENV = "DECOCTL_RAY_WHEELS"
#: what every refusal tells the user to give
FLAG = f"--ray-wheels DIR (or wheels=DIR, or {WHEELS_ENV}=DIR)"
#: decoctl's own distribution
DECOCTL = "decoctl"
#: the extras of decoctl whose requirements the workers get: batch actors and serve replicas share one environment
#: (one virtualenv a node, made once), and the replicas need the server's
EXTRAS = ("serve",)


@attrs.frozen(kw_only=True)
class Wheel:
    """A wheel file of one distribution: its canonical name and its version, as its file name says them."""

    path: Path
    name: str
    version: str

    @classmethod
    def of(cls, path: Path) -> Wheel:
        """The wheel at ``path``; ConfigError for a file whose name is not a wheel's."""
        try:
            name, version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename as exc:
            raise ConfigError(f"{path} is not a wheel ({exc})") from None
        return cls(path=path, name=str(name), version=str(version))


def distributions_in_use(registry: Any) -> dict[str, str]:
    """The distributions a worker needs, by canonical name, with the versions installed here: decoctl, and every
    distribution whose plugins ``registry`` (a PluginRegistry) loaded through its entry points."""
    import importlib.metadata

    names = {DECOCTL} | {canonicalize_name(dist.project_name) for _, dist in registry.manager.list_plugin_distinfo()}
    return {name: importlib.metadata.version(name) for name in sorted(names)}


def find_wheels(wanted: Mapping[str, str], folder: str | Path | None, scratch: Path) -> list[Wheel]:
    """One wheel for each of ``wanted`` (canonical name -> version): from ``folder`` (or the one ``WHEELS_ENV``
    names), else from where each was installed from (a wheel built from a source folder goes into ``scratch``).
    ConfigError naming the distribution, the versions and the flag where one is missing or of another version."""
    folder = folder if folder is not None else (os.environ.get(WHEELS_ENV) or None)
    if folder is None:
        return [_installed_wheel(name, version, scratch) for name, version in wanted.items()]
    where = Path(folder).expanduser()
    if not where.is_dir():
        raise ConfigError(f"the wheels folder {where} does not exist: give the folder `make dist` writes (dist/)")
    found: dict[str, list[Wheel]] = {}
    for path in sorted(where.glob("*.whl")):
        with contextlib.suppress(ConfigError):
            wheel = Wheel.of(path)
            found.setdefault(wheel.name, []).append(wheel)
    return [_pick(found.get(name, []), name, version, where) for name, version in wanted.items()]


def _pick(candidates: Sequence[Wheel], name: str, version: str, folder: Path) -> Wheel:
    same = [w for w in candidates if _same_version(w.version, version)]
    if not same:
        others = ", ".join(sorted({w.version for w in candidates}))
        has = f"has {name} {others} only" if others else f"has no wheel of {name}"
        raise ConfigError(
            f"the wheels folder {folder} {has}, and the {name} installed here is {version}: Ray's workers must run "
            f"the same version, so build its wheel (make dist, or pip wheel --no-deps) and give its folder with {FLAG}"
        )
    if len(same) > 1:
        from packaging.tags import sys_tags

        here = {str(tag) for tag in sys_tags()}
        fits = [w for w in same if any(str(tag) in here for tag in parse_wheel_filename(w.path.name)[3])]
        if len(fits) != 1:
            listed = ", ".join(w.path.name for w in same)
            raise ConfigError(f"the wheels folder {folder} has several wheels of {name} {version} ({listed}): keep one")
        return fits[0]
    return same[0]


def _installed_wheel(name: str, version: str, scratch: Path) -> Wheel:
    """The wheel ``name`` was installed from, where its direct_url.json names a wheel file that is still there, or
    one built from the source folder it names (an editable or folder install). ConfigError naming the flag
    otherwise."""
    import importlib.metadata

    text = importlib.metadata.distribution(name).read_text("direct_url.json")
    direct = json.loads(text) if text else {}
    url = urlparse(direct.get("url", ""))
    path = Path(unquote(url.path)) if url.scheme == "file" else None
    if path is not None and "archive_info" in direct and path.suffix == ".whl" and path.is_file():
        return _checked_version(Wheel.of(path), version, f"the wheel {name} was installed from")
    source = path is not None and any((path / f).is_file() for f in ("pyproject.toml", "setup.py"))
    if path is not None and "dir_info" in direct and source:
        return _checked_version(_built(name, path, scratch), version, f"the wheel built from {path}")
    how = f"installed from {direct['url']}" if direct.get("url") else "installed from a package index"
    raise ConfigError(
        f"Ray's workers get {name} {version} from its wheel, and this one was {how}, with no wheel file or source "
        f"folder to take it from: give the folder of its wheel with {FLAG}"
    )


def _same_version(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _checked_version(wheel: Wheel, version: str, what: str) -> Wheel:
    if not _same_version(wheel.version, version):
        raise ConfigError(
            f"{what} ({wheel.path.name}) is {wheel.name} {wheel.version}, and the one installed here is {version}: "
            f"give the folder of a wheel of {version} with {FLAG}"
        )
    return wheel


def _built(name: str, source: Path, scratch: Path) -> Wheel:
    """A wheel of the distribution ``name`` built from ``source`` into ``scratch`` with ``pip wheel --no-deps``;
    ConfigError with pip's last lines and the flag where it cannot be built."""
    out = scratch / "built" / name
    out.mkdir(parents=True)
    started = time.perf_counter()
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    built = sorted(out.glob("*.whl"))
    if done.returncode != 0 or len(built) != 1:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-3:]
        raise ConfigError(
            f"could not build a wheel of {name} from {source} for Ray's workers ({' / '.join(lines) or 'no wheel'}): "
            f"build it yourself (make dist, or python -m build) and give its folder with {FLAG}"
        )
    log.info("decoctl.ray_wheel_built", distribution=name, source=str(source), seconds=time.perf_counter() - started)
    return Wheel.of(built[0])


def unpack(wheel: Wheel, into: Path) -> list[Path]:
    """``wheel``'s files laid out under ``into`` as pip installs them (a ``NAME.data/purelib`` or ``platlib``
    folder's files at the top; its scripts, headers and data left out: a worker imports, it runs no script), after
    checking each against the wheel's RECORD: the top-level entries made. ConfigError naming the wheel and what is
    wrong with it for a file that is not a zip, lacks its metadata or RECORD, or whose contents its RECORD does not
    match."""
    try:
        with zipfile.ZipFile(wheel.path) as archive:
            members = {info.filename: info for info in archive.infolist() if not info.is_dir()}
            info_dir = _dist_info(wheel, members)
            metadata = HeaderParser().parsestr(archive.read(f"{info_dir}/METADATA").decode("utf-8"))
            named = canonicalize_name(metadata["Name"] or "") == wheel.name
            if not named or not _same_version(metadata["Version"] or "", wheel.version):
                raise _broken(wheel, f"its metadata says {metadata['Name']} {metadata['Version']}")
            record = _record(wheel, archive.read(f"{info_dir}/RECORD").decode("utf-8"))
            data_dir = info_dir.removesuffix(".dist-info") + ".data/"
            tops: set[Path] = set()
            for name, info in members.items():
                content = archive.read(info)
                _check(wheel, name, content, record)
                target = _target(name, data_dir)
                if target is None:
                    continue
                if Path(target).is_absolute() or ".." in Path(target).parts:
                    raise _broken(wheel, f"{name} would be written outside the folder it is installed in")
                destination = into / target
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(content)
                if info.external_attr >> 16 & 0o111:
                    destination.chmod(0o755)
                top = Path(target).parts[0]
                if top != target or target.endswith(".py"):  # a folder, or a module of one file
                    tops.add(into / top)
                elif not target.endswith(".pth"):  # a .pth file works only in site-packages: left out
                    raise _broken(
                        wheel, f"Ray ships folders and .py files to its workers, and it has {target} at its top"
                    )
    except zipfile.BadZipFile as exc:
        raise _broken(wheel, f"it is not a zip file ({exc})") from None
    except KeyError as exc:
        raise _broken(wheel, f"it lacks {exc.args[0]}") from None
    return sorted(tops)


def _dist_info(wheel: Wheel, members: Iterable[str]) -> str:
    folders = {name.split("/", 1)[0] for name in members if name.split("/", 1)[0].endswith(".dist-info")}
    mine = [f for f in folders if canonicalize_name(f.removesuffix(".dist-info").rpartition("-")[0]) == wheel.name]
    if len(mine) != 1:
        raise _broken(wheel, f"it has {len(mine)} .dist-info folders of {wheel.name}, not one")
    return mine[0]


def _record(wheel: Wheel, text: str) -> dict[str, str]:
    """RECORD's "sha256=..." hash by file name (RECORD itself and signatures unhashed)."""
    hashes = {row[0]: row[1] for row in csv.reader(text.splitlines()) if len(row) >= 2 and row[0] and row[1]}
    if not hashes:
        raise _broken(wheel, "its RECORD lists no file")
    return hashes


def _check(wheel: Wheel, name: str, content: bytes, record: Mapping[str, str]) -> None:
    if name.endswith(".dist-info/RECORD") or name.endswith((".dist-info/RECORD.jws", ".dist-info/RECORD.p7s")):
        return
    expected = record.get(name)
    if expected is None:
        raise _broken(wheel, f"its RECORD does not list {name}")
    algorithm, _, digest = expected.partition("=")
    if algorithm not in ("sha256", "sha384", "sha512"):
        raise _broken(wheel, f"its RECORD hashes {name} with {algorithm!r}")
    actual = base64.urlsafe_b64encode(hashlib.new(algorithm, content).digest()).rstrip(b"=").decode()
    if actual != digest:
        raise _broken(wheel, f"{name} does not match its RECORD (damaged, or changed after the build)")


def _target(name: str, data_dir: str) -> str | None:
    """Where a wheel member goes, relative to the install folder (None: not installed for a worker)."""
    if not name.startswith(data_dir):
        return name
    kind, _, rest = name.removeprefix(data_dir).partition("/")
    return rest if kind in ("purelib", "platlib") and rest else None


def _broken(wheel: Wheel, why: str) -> ConfigError:
    return ConfigError(f"the wheel {wheel.path} cannot be installed on Ray's workers: {why}; build it again")


def requirements(wheels: Sequence[Wheel], extras: Iterable[str] = ()) -> tuple[str, ...]:
    """What ``wheels`` require besides one another, with ``extras`` of decoctl (and the extras they name of the
    wheels' own distributions), as the wheels' metadata states it and its markers hold here: pip requirement
    lines."""
    metadata = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel.path) as archive:
            members = [info.filename for info in archive.infolist()]
            text = archive.read(f"{_dist_info(wheel, members)}/METADATA").decode("utf-8")
        metadata[wheel.name] = HeaderParser().parsestr(text).get_all("Requires-Dist") or []
    wanted: dict[str, set[str]] = {name: set() for name in metadata}
    wanted[DECOCTL] = wanted.get(DECOCTL, set()) | set(extras)
    lines: dict[str, None] = {}
    todo = list(metadata)
    while todo:
        name = todo.pop()
        for line in metadata[name]:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            marker = requirement.marker
            if marker is not None and not any(marker.evaluate({"extra": e}) for e in ("", *sorted(wanted[name]))):
                continue
            other = canonicalize_name(requirement.name)
            if other in wanted:
                if not requirement.extras <= wanted[other]:
                    wanted[other] |= requirement.extras
                    todo.append(other)
                continue
            requirement.marker = None
            lines[str(requirement)] = None
    return tuple(sorted(lines))


def worker_runtime_env(
    ray: Any,
    registry: Any,
    *,
    wheels: str | Path | None = None,
    runtime_env: Mapping[str, Any] | None = None,
    extras: Iterable[str] = EXTRAS,
) -> dict[str, Any]:
    """The runtime_env for decoctl's actors and replicas on the cluster ``ray`` has joined: the wheels of the
    distributions in use (see the module's docstring) uploaded as ``py_modules``, what they require with decoctl's
    ``extras`` in ``pip``, merged with this job's runtime_env and the ``runtime_env`` given (their ``py_modules`` and
    ``pip`` packages kept beside decoctl's, their ``env_vars`` and other fields as they are). ConfigError, before
    any worker starts, for a wheel that is missing, of another version or broken.

    The same wheels give the same runtime_env: what was unpacked and uploaded once is not again while the cluster
    still has it (a process that runs many datasets pays for it once)."""
    wanted = distributions_in_use(registry)
    job = ray.get_runtime_context().runtime_env or {}
    with tempfile.TemporaryDirectory(prefix="decoctl-ray-") as staging:
        root = Path(staging)
        found = find_wheels(wanted, wheels, root)
        key = (_gcs_address(ray), tuple(sorted(extras)), *((str(w.path), *_stamp(w.path)) for w in found))
        shipped = _SHIPPED.get(key)
        if shipped is None or not _on_cluster(shipped[0]):
            entries: list[Path] = []
            for wheel in found:
                entries += unpack(wheel, root / "unpacked" / wheel.name)
            shipped = (_uploaded(entries, root), requirements(found, extras))
            if not any(w.path.is_relative_to(root) for w in found):  # a wheel built here is built again next time
                _SHIPPED[key] = shipped
    uris, pip = shipped
    log.info("decoctl.ray_wheels", wheels=[w.path.name for w in found], uris=len(uris), gcs=key[0] or "unknown")
    return merged(merged(dict(job), runtime_env or {}), {"py_modules": list(uris), "pip": list(pip)})


#: what worker_runtime_env uploaded, by cluster, extras and wheel files (path, size, time): the URIs and requirements
_SHIPPED: dict[tuple[Any, ...], tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _stamp(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_size, status.st_mtime_ns


def _on_cluster(uris: Iterable[str]) -> bool:
    from ray._private.runtime_env.packaging import package_exists

    return all(package_exists(uri) for uri in uris)


def _gcs_address(ray: Any) -> str:
    with contextlib.suppress(Exception):
        return str(ray.get_runtime_context().gcs_address)
    return ""


def _uploaded(entries: Sequence[Path], scratch: Path) -> tuple[str, ...]:
    """``entries`` (folders and single files to import) uploaded to the cluster's GCS by Ray, as it uploads a job's
    py_modules: their URIs, named by the hash of their contents."""
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    # Ray says what it uploads at INFO, into decoctl's logger here, and warns of every file over a few MiB (the
    # models bundle's weights, which are what it is for) on a logger of its own: that one at ERROR for the upload
    ray_packaging = logging.getLogger("ray._private.runtime_env.packaging")
    level = ray_packaging.level
    ray_packaging.setLevel(logging.ERROR)
    try:
        uploaded = upload_py_modules_if_needed(
            {"py_modules": [str(p) for p in entries]},
            include_gitignore=False,
            scratch_dir=str(scratch),
            logger=logging.getLogger(__name__),
        )
    finally:
        ray_packaging.setLevel(level)
    return tuple(uploaded["py_modules"])


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` added: ``py_modules`` lists joined, ``pip`` (or ``uv``) packages joined (its options
    kept), ``env_vars`` merged (``extra``'s win), any other field ``extra``'s where it gives one."""
    out = dict(base)
    for key, value in extra.items():
        if key == "py_modules":
            out[key] = [*out.get(key, []), *[m for m in value if m not in out.get(key, [])]]
        elif key == "pip":
            packages = _packages(value)
            target = "uv" if "uv" in out and "pip" not in out else "pip"
            if "conda" in out and target == "pip":
                continue  # a conda environment of the user's own brings the packages
            given = out.get(target)
            config = dict(given) if isinstance(given, Mapping) else {"packages": list(given or [])}
            config["packages"] = [*_packages(given), *[p for p in packages if p not in _packages(given)]]
            out[target] = config
        elif key == "env_vars":
            out[key] = {**out.get(key, {}), **value}
        else:
            out[key] = value
    return out


def _packages(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, Mapping):
        return list(value.get("packages", []))
    return list(value)


#: how Ray's message starts where a node could not set up a runtime environment
SETUP_FAILED = "Failed to set up runtime environment"
#: Ray's words before the reason a runtime environment could not be set up
_SETUP_NOISE = re.compile(r"^(Traceback|  File |\s+\^|During handling|The above exception|ray\.|Failed to set up)")


def setup_error(exc: BaseException) -> DecoctlError | None:
    """The runtime environment a worker could not set up (Ray's RuntimeEnvSetupError, however deeply wrapped, or a
    message that carries one) as one line: what failed, in Ray's words. None where ``exc`` is not that."""
    text = _setup_text(exc)
    if text is None:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:") or re.match(r"^\w+(Error|Exception): ", line)]
    reason = (errors or [line for line in lines if not _SETUP_NOISE.match(line)] or lines or ["no reason given"])[-1]
    return DecoctlError(
        f"a Ray worker could not set up decoctl's runtime environment: {reason[:400]} (the whole log: "
        "runtime_env_setup-*.log in the node's Ray logs, /tmp/ray/session_latest/logs)"
    )


def _setup_text(exc: BaseException) -> str | None:
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        error = todo.pop()
        if not isinstance(error, BaseException) or id(error) in seen:
            continue
        seen.add(id(error))
        if type(error).__name__ == "RuntimeEnvSetupError":
            return str(getattr(error, "error_message", None) or error)
        message = str(error)
        for marker in ("RuntimeEnvSetupError", SETUP_FAILED):  # Serve keeps the message without the class's name
            if marker in message:
                return message.split(marker, 1)[1]
        todo.extend([error.__cause__, error.__context__, getattr(error, "cause", None)])
    return None

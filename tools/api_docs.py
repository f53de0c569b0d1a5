"""decoctl's API reference: pdoc over exactly the public modules (decoctl._api.PUBLIC_MODULES), written to a folder.

    python -W error tools/api_docs.py build/docs        # what `make docs` runs

Before it writes anything it checks what would make the reference wrong or thin, and exits with status 1 listing
every problem:

- a public name without a docstring: a name in a public module's ``__all__``, or a public method of a class there;
- a cross-reference that leads nowhere: a Sphinx role (``:func:`write_head```) or a backticked dotted name under
  decoctl (````decoctl.model.graph````) in a docstring the reference shows, naming nothing the reference documents
  (a misspelt or removed name, or a private module's).

pdoc's own complaints (a name in ``__all__`` that does not exist, an annotation it cannot evaluate) are warnings,
which ``-W error`` makes errors.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pdoc
import pdoc.doc
import pdoc.doc_ast
import pdoc.render

from decoctl._api import PUBLIC_MODULES

#: ``:role:`target``` (the target may start with ~, which shortens how Sphinx shows it)
ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|exc|obj|const):`~?([\w.]+)`")
#: a backticked dotted name under decoctl, in single or double backticks
DOTTED = re.compile(r"(?<![\w`])``?(decoctl(?:\.\w+)+)``?")


def load() -> list[pdoc.doc.Module]:
    """The public modules as pdoc documents them, every lazily exported name loaded first (pdoc reads a package's
    namespace, in which a PEP 562 name appears only once it has been used), and a constant that a package
    re-exports given the docstring it has where it is defined (pdoc reads a constant's docstring from the source of
    the module that shows it)."""
    modules = []
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for public in getattr(module, "__all__", ()):
            getattr(module, public)
        modules.append(pdoc.doc.Module(module))
    for module in modules:
        for member in module.members.values():
            if isinstance(member, pdoc.doc.Variable) and not member.docstring:
                member.docstring = _defined_docstring(member.name, getattr(module.obj, member.name))
    return modules


def _defined_docstring(name: str, value: object) -> str:
    """The docstring of the constant ``name`` in the decoctl module that defines it (empty when none has one)."""
    for module_name, module in sorted(sys.modules.items()):
        if module_name.startswith("decoctl") and getattr(module, name, None) is value:
            found = pdoc.doc_ast.walk_tree(module).var_docstrings.get(name)
            if found:
                return found
    return ""


def members(module: pdoc.doc.Module) -> Iterator[pdoc.doc.Doc]:
    """What the reference shows of ``module``: its public names, and the members of its public classes."""
    for member in module.members.values():
        if isinstance(member, pdoc.doc.Module):
            continue
        yield member
        if isinstance(member, pdoc.doc.Class):
            yield from (m for m in member.members.values() if not m.name.startswith("_"))


def documented(modules: list[pdoc.doc.Module]) -> set[str]:
    """Every name the reference documents, as a reference may spell it: where it is shown, and where it is defined
    when a public module re-exports it (``decoctl.Generator`` and ``decoctl.generation.Generator``)."""
    names = {module.fullname for module in modules}
    for module in modules:
        for member in members(module):
            names.add(member.fullname)
            names.add(".".join(member.taken_from))
    return names


def missing_docstrings(modules: list[pdoc.doc.Module]) -> list[str]:
    """Public names without a docstring: every name in ``__all__``; of a class, its public methods (its fields and
    properties are described in the class's docstring)."""
    problems = []
    for module in modules:
        if not module.docstring.strip():
            problems.append(f"{module.fullname}: the module has no docstring")
        for member in module.members.values():
            if isinstance(member, pdoc.doc.Module):
                continue
            if not member.docstring.strip():
                problems.append(f"{member.fullname}: no docstring")
            if isinstance(member, pdoc.doc.Class) and member.taken_from[0].startswith("decoctl"):
                problems.extend(
                    f"{method.fullname}: no docstring"
                    for method in member.own_members
                    if isinstance(method, pdoc.doc.Function)
                    and not method.name.startswith("_")
                    and not method.docstring.strip()
                )
    return sorted(set(problems))


def broken_references(modules: list[pdoc.doc.Module]) -> list[str]:
    """Cross-references in the docstrings the reference shows that name nothing it documents."""
    known = documented(modules)
    problems = set()
    for module in modules:
        for doc in (module, *members(module)):
            if not doc.docstring:
                continue
            where = doc.taken_from[0] if not isinstance(doc, pdoc.doc.Module) else doc.modulename
            scopes = _scopes(doc, where)
            for target in ROLE.findall(doc.docstring):
                if not any(f"{scope}{target}" in known for scope in scopes):
                    problems.add(f"{doc.fullname}: :role:`{target}` names nothing the reference documents")
            for target in DOTTED.findall(doc.docstring):
                if _is_code(target) and target not in known:
                    problems.add(f"{doc.fullname}: `{target}` names nothing the reference documents")
    return sorted(problems)


def _is_code(dotted: str) -> bool:
    """Whether a dotted name under decoctl names code (``decoctl.model.graph``), not something else spelt so (an
    event, ``decoctl.plugin_skipped``; a logger; the header ``decoctl.h``): its first part is one of the package's
    modules or names."""
    import pkgutil

    import decoctl

    first = dotted.split(".")[1]
    modules = {info.name for info in pkgutil.iter_modules(decoctl.__path__)}
    return first in modules or first in decoctl.__all__


def _scopes(doc: pdoc.doc.Doc, module: str) -> list[str]:
    """The prefixes a relative name in ``doc``'s docstring is looked up under: none (fully qualified), its class,
    its module (where it is defined and where it is shown)."""
    scopes = [""]
    if isinstance(doc, pdoc.doc.Class):
        scopes.append(f"{doc.fullname}.")
    parent = doc.fullname.rpartition(".")[0]
    scopes += [f"{parent}.", f"{module}.", f"{doc.modulename}."]
    return scopes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="build/docs", type=Path, help="the folder to write (build/docs)")
    args = parser.parse_args(argv)
    modules = load()
    problems = missing_docstrings(modules) + broken_references(modules)
    if problems:
        print(f"the API reference has {len(problems)} problem(s):", *problems, sep="\n  ", file=sys.stderr)
        return 1
    write(modules, args.out)
    print(f"the API reference of {len(modules)} public modules is in {args.out}/index.html")
    return 0


def write(modules: list[pdoc.doc.Module], out: Path) -> None:
    """Render the modules (as pdoc.pdoc does, over these documents and no others) into ``out``."""
    pdoc.render.configure(docformat="restructuredtext", footer_text="decoctl: the public API")
    every = {module.fullname: module for module in modules}
    for module in modules:
        page = out / f"{module.fullname.replace('.', '/')}.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(pdoc.render.html_module(module, every), encoding="utf-8")
    (out / "index.html").write_text(pdoc.render.html_index(every), encoding="utf-8")
    (out / "search.js").write_text(pdoc.render.search_index(every), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())

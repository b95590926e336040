"""griffe extensions for the API pages: pyproject's package-dir mapping, and Sphinx roles.

``PackageDirs`` loads the subpackages that pyproject.toml maps to folders of their own.

aggdec installs ``runtime/``, ``export/`` and ``engines/`` (top-level folders) as
``aggdec.runtime``, ``aggdec.export`` and ``aggdec.engines`` through setuptools'
``[tool.setuptools.package-dir]``. griffe finds a package's submodules by walking its folder,
so it never sees these; without this extension ``::: aggdec.runtime.generator`` in the API
pages fails. The mapping is read from pyproject.toml, so a new mapped subpackage needs no
change here.

``SphinxRoles`` shows the docstrings' Sphinx cross-reference roles (``:class:`Generator```,
``:func:`~.manifest.load_manifest```) as code, ``Generator``, instead of the raw role text that
the Google-style parser would leave.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import griffe

if sys.version_info >= (3, 11):
    import tomllib
else:  # the [docs] extra brings tomli on Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Path]:
    """Dotted package name -> its folder, from ``[tool.setuptools.package-dir]``."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name: (pyproject.parent / folder).resolve() for name, folder in mapping.items()}


class PackageDirs(griffe.Extension):
    """Attach each mapped subpackage (``aggdec.runtime`` ...) under its loaded parent package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        prefix = pkg.name + "."
        # Parents before children, so that a nested mapping finds its parent attached.
        mapped = sorted((name for name in package_dirs() if name.startswith(prefix)), key=lambda n: n.count("."))
        for dotted in mapped:
            parent_path, _, name = dotted.rpartition(".")
            parent = pkg if parent_path == pkg.name else pkg.get_member(parent_path[len(prefix) :])
            if name in parent.members:  # already found by griffe's own walk
                continue
            init = package_dirs()[dotted] / "__init__.py"
            # griffe has no public call to load a folder as a submodule of a loaded package;
            # _load_module(parent=...) is what its own submodule walk calls.
            module = loader._load_module(name, init, submodules=True, parent=parent)
            parent.set_member(name, module)
            loader.expand_exports(module)
            loader.expand_wildcards(module, external=False)


# :class:`X`, :func:`~.mod.x`, ... -> `X`, `mod.x` (the leading ~ or . of a Sphinx target dropped)
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`[~.]*([^`]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring as inline code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)

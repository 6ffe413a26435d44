"""Data flows one way: the reference stands aside and imports nothing from the runtime
or the kernels (../shared/style.md)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "attnv41"
ALLOWED = {"config"}  # the reference may read the geometry, nothing downstream of it


def test_reference_imports_nothing_downstream():
    files = sorted((SRC / "reference").glob("*.py"))
    assert files
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                mod = (node.module or "").split(".")[0]
                if node.level == 1:
                    continue  # siblings inside reference/
                assert mod in ALLOWED, f"{f.name} imports ..{node.module}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for n in names:
                    assert not n.startswith(
                        ("attnv41.runtime", "attnv41.kernels", "attnv41.state", "attnv41.weights")
                    ), f"{f.name} imports {n}"


def test_the_package_ships_its_type_marker():
    """PEP 561: `py.typed` in the package and in its package data, so an engine's type
    checker reads attnv41's annotations from an installed wheel."""
    assert (SRC / "py.typed").is_file()
    lines = (SRC.parents[1] / "pyproject.toml").read_text().splitlines()
    data = lines[lines.index("[tool.setuptools.package-data]") + 1]  # tomllib needs Python 3.11
    assert data.startswith("attnv41 = [") and '"py.typed"' in data

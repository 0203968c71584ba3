"""The adapters are written against the public API: they import no private module of the core."""

from __future__ import annotations

import ast
from pathlib import Path

ADAPTERS = Path(__file__).resolve().parents[1] / "adapters"


def test_adapters_import_only_public_names_of_the_core():
    for path in sorted(ADAPTERS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainsignals"):
                parts = node.module.split(".")
                assert not any(p.startswith("_") for p in parts), f"{path.name} imports {node.module}"
                assert not any(a.name.startswith("_") for a in node.names), f"{path.name} imports a private name"


def test_every_name_in_all_is_there():
    import trainsignals as ts

    assert [n for n in ts.__all__ if not hasattr(ts, n)] == []

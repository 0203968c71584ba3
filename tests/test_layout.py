"""The layout shows the architecture: the README's layout table names every package, and the
NumPy core imports nothing from the edges (I/O, curves, evaluation, CLI, adapters)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "trainsignals"
EDGES = ("trainsignals.io", "trainsignals.curves", "trainsignals.eval", "trainsignals.cli", "trainsignals.adapters")


def test_the_readme_layout_names_every_package():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Layout"):]
    section = section[:section.index("\n## ", 4)]
    named = set(re.findall(r"`([\w/]+/)`", section))
    packages = {f"trainsignals/{p.parent.relative_to(CORE)}/" for p in CORE.rglob("__init__.py") if p.parent != CORE}
    assert packages <= named, f"packages missing from the README's layout: {sorted(packages - named)}"
    assert {"adapters/", "datasets/", "tests/", "benchmarks/", "examples/", "docs/"} <= named
    for path in named:
        assert (ROOT / path).is_dir(), f"the README's layout names {path}, which does not exist"


def _imports(path: Path, package: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                out.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_real_run_modules_import_one_way():
    """real_runs -> families -> (training, labels): nothing imports back up, nor a private name."""
    curves = CORE / "curves"
    allowed = {"training": set(), "labels": set(), "families": {"training", "labels"},
               "real_runs": {"training", "labels", "families"}}
    for name, ok in allowed.items():
        tree = ast.parse((curves / f"{name}.py").read_text())
        used = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainsignals.curves."):
                used.add(node.module.rsplit(".", 1)[-1])
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"curves/{name}.py imports private {private} from {node.module}"
            elif isinstance(node, ast.ImportFrom) and node.module == "trainsignals.curves":
                used.update(a.name for a in node.names if a.name in allowed)
        assert used <= ok, f"curves/{name}.py imports {sorted(used - ok)}"


def test_the_core_does_not_import_the_edges():
    core_files = [p for p in CORE.glob("*.py")] + list((CORE / "detectors").glob("*.py"))
    for path in core_files:
        if path.name in ("__init__.py", "testing.py"):  # lazy re-exports; the test helpers read curves
            continue
        pkg = "trainsignals" if path.parent == CORE else "trainsignals.detectors"
        bad = sorted(m for m in _imports(path, pkg) if m.startswith(EDGES))
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"

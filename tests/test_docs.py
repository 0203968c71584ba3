"""The documentation builds and its examples run.

* ``mkdocs build --strict`` builds the site into a temporary folder (skipped when mkdocs is
  not installed): broken links, missing pages and unresolved API references fail it.
* Every Python code block of ``README.md`` and ``docs/**/*.md`` runs, the blocks of one page in
  order in one namespace, in a temporary working directory. Conventions (``docs/_setup/README.md``):
  ``<!-- setup: NAME[, NAME] -->`` on the line before a block runs ``docs/_setup/NAME.py`` first;
  ``<!-- requires: MODULE -->`` skips the block (with a warning) when MODULE cannot be imported;
  a fence info string with ``no-run`` shows a block without running it.
* A ``print(...)`` line whose comment is a printed value (it starts with ``[``, ``(``, a quote,
  a digit, ``True``, ``False`` or ``None``) must print exactly that: the page shows real output.
* The README's headline table is the one ``docs/make_figures.py`` generated last.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SETUP = DOCS / "_setup"
PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if SETUP not in p.parents)]
_FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>```+|~~~+)\s*(?P<info>[^\n`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<key>setup|requires)\s*:\s*(?P<value>[^>]*?)\s*-->\s*$")


@dataclass
class Block:
    """One fenced code block of a page."""

    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    code: str
    setup: list[str] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)

    @property
    def language(self) -> str:
        return self.info.split()[0].lstrip("{.").rstrip("}") if self.info else ""

    @property
    def runs(self) -> bool:
        return self.language in ("python", "py") and "no-run" not in self.info.split()


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the markers on the line before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, info = len(m["indent"]), m["ticks"], m["info"].strip()
        setup: list[str] = []
        requires: list[str] = []
        j = i - 1
        while j >= 0 and (marker := _MARKER.match(lines[j])):
            names = [v.strip() for v in marker["value"].split(",") if v.strip()]
            (setup if marker["key"] == "setup" else requires).extend(names)
            j -= 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(ticks[0] * len(ticks))
                                      and lines[i].strip().strip(ticks[0]) == ""):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        blocks.append(Block(path, i - len(body), info, "\n".join(body) + "\n", setup, requires))
        i += 1
    return blocks


#: ``print(ARGS)  # OUTPUT`` where OUTPUT reads as a value, not a description
_SHOWN = re.compile(r"^(?P<indent>\s*)print\((?P<args>.*)\)\s+#\s*(?P<out>[\[('\"0-9-].*|True|False|None)\s*$")


def _expect_output(expected: str, *args: object) -> None:
    text = " ".join(map(str, args))
    print(text)
    assert text == expected, f"printed {text!r}, the page says {expected!r}"


def checked(code: str) -> str:
    """``code`` with each ``print`` whose comment shows the output turned into a check of that output."""
    return "\n".join(f"{m['indent']}_expect_output({m['out']!r}, {m['args']})" if (m := _SHOWN.match(line)) else line
                     for line in code.split("\n"))


def _run(code: str, name: str, namespace: dict) -> None:
    namespace.setdefault("_expect_output", _expect_output)
    exec(compile(checked(code), name, "exec"), namespace)  # noqa: S102 - the documentation's own examples


def test_shown_output_is_checked() -> None:
    ns: dict = {}
    _run("print([1, 2][:1])   # [1]\nprint('x')  # a description, not checked\n", "t", ns)
    with pytest.raises(AssertionError, match="the page says"):
        _run("print(1 + 1)   # 3\n", "t", ns)


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_fence_parser_reads_markers(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("text\n\n<!-- requires: json -->\n<!-- setup: a, b -->\n```python\nx = 1\n```\n\n"
                    "```python no-run\nboom()\n```\n\n* item\n\n    ```bash\n    ls\n    ```\n")
    blocks = code_blocks(page)
    assert [(b.language, b.runs, b.setup, b.requires, b.line) for b in blocks] == [
        ("python", True, ["a", "b"], ["json"], 5), ("python", False, [], [], 9), ("bash", False, [], [], 15)]
    assert blocks[0].code == "x = 1\n" and blocks[2].code == "ls\n"


@pytest.mark.parametrize("path", [p for p in PAGES if any(b.runs for b in code_blocks(p))], ids=_page_id)
def test_code_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # run as a user's script would: the checkout's own folders (``datasets/`` is data, and would
    # shadow Hugging Face ``datasets`` as a namespace package) are not importable
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(ROOT))])
    shadow = sys.modules.get("datasets")
    if shadow is not None and getattr(shadow, "__file__", None) is None:
        monkeypatch.delitem(sys.modules, "datasets")
    module = types.ModuleType("__docs__")  # a real module: classes defined in a page pickle by reference
    monkeypatch.setitem(sys.modules, "__docs__", module)
    namespace: dict = module.__dict__
    out = io.StringIO()
    for block in code_blocks(path):
        if not block.runs:
            continue
        missing = [m for m in block.requires if _missing(m)]
        if missing:  # an optional extra that is not installed: this block only
            warnings.warn(f"{_page_id(path)}:{block.line} not run: {', '.join(missing)} not installed", stacklevel=1)
            continue
        where = f"{_page_id(path)}:{block.line}"
        try:
            with contextlib.redirect_stdout(out):
                for name in block.setup:
                    setup = SETUP / f"{name}.py"
                    assert setup.is_file(), f"{where}: no setup {setup.relative_to(ROOT)}"
                    _run(setup.read_text(), str(setup), namespace)
                _run(block.code, where, namespace)
        except Exception as exc:
            raise AssertionError(f"the code block at {where} failed: {exc!r}\n--- block ---\n{block.code}") from exc


def _missing(module: str) -> bool:
    """Whether ``module`` (dotted names too) cannot be imported here."""
    try:
        return importlib.util.find_spec(module) is None
    except (ModuleNotFoundError, ValueError):
        return True


def test_every_setup_is_used() -> None:
    used = {name for p in PAGES for b in code_blocks(p) for name in b.setup}
    assert used == {p.stem for p in SETUP.glob("*.py")}


def test_readme_headline_is_the_generated_one() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- bench:start[^>]*-->\n(.*?)<!-- bench:end -->", readme, flags=re.S)
    assert m, "README.md lost its bench:start / bench:end markers"
    assert m[1] == (DOCS / "generated" / "headline.md").read_text(encoding="utf-8"), (
        "README.md's headline table differs from docs/generated/headline.md: run python docs/make_figures.py")


def test_readme_keeps_its_two_setup_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    test_command = next(line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                        if "pytest" in line and not line.startswith("#"))  # what CI runs
    assert ("python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/trainsignals demo"
            in readme)
    assert test_command in readme, "the README's test command is not the one .ci/run runs"


def test_images_are_committed_and_small() -> None:
    referenced = set()
    for p in PAGES:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", p.read_text(encoding="utf-8")):
            referenced.add((p.parent / target).resolve())
    assert referenced, "no pictures referenced"
    for img in referenced:
        assert img.is_file(), img
        assert img.stat().st_size < 200_000, f"{img} is over 200 kB"


def test_site_builds_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs / mkdocstrings not installed (the docs extra)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    mkdocs = [sys.executable, "-m", "mkdocs"]
    proc = subprocess.run([*mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "core" / "index.html").is_file()
    assert not (tmp_path / "site" / "_setup").exists()

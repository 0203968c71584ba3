"""datasets/README.md says what the suite files hold: every column, and what is true of the committed files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainsignals.curves import default_directory, generate, load_suite, write_suite

README = Path(__file__).resolve().parents[1] / "datasets" / "README.md"


def _documented_columns() -> set[str]:
    text = README.read_text()
    table = text[text.index("Columns of each `.arrow` file:"):]
    table = table[:table.index("\n\n", table.index("| column |"))]
    names: set[str] = set()
    for row in table.splitlines()[2:]:
        first = row.split("|")[1]
        names.update(re.findall(r"`([a-z_]+)`", first))
    return names


def test_every_column_of_the_format_is_documented(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow.ipc as ipc

    write_suite([generate("healthy", 0, "easy", n_steps=400)], tmp_path)
    with ipc.open_file(tmp_path / "healthy.arrow") as reader:
        written = set(reader.schema.names)
    assert _documented_columns() == written


def test_the_committed_synthetic_files_lack_pred_spread_and_load_it_empty() -> None:
    pytest.importorskip("pyarrow")
    import pyarrow.ipc as ipc

    directory = default_directory()
    if not (directory / "manifest.json").is_file():
        pytest.skip("the committed datasets are not here")
    with ipc.open_file(directory / "healthy.arrow") as reader:
        assert "pred_spread" not in reader.schema.names    # as the README says: written before the column
    assert all(len(c.pred_spread) == 0 for c in load_suite() if c.kind == "healthy")
    text = README.read_text()
    assert "bit for bit" not in text and "pred_spread" in text

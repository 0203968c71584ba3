"""A TensorBoard event file damaged in the middle is read up to the damage, with a ``LogDamagedWarning``.

TensorBoard's reader stops, silently, at the first record that fails a CRC check; the importer
verifies each record's two checksums (its length's and its data's) and says where it stopped,
as it does for a file cut short.
"""

from __future__ import annotations

import struct
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from trainsignals.io import importers
from trainsignals.io.importers import LogDamagedWarning, import_tensorboard

pytest.importorskip("tensorboard")

STEPS = 400


def _write(logdir: Path, steps: int = STEPS, big_every: int = 0) -> Path:
    """An event file of ``steps`` losses (and, every ``big_every`` steps, an image record of 3,000 bytes)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(logdir))
    rng = np.random.default_rng(0)
    for s in range(steps):
        value = summary_pb2.Summary.Value(tag="train/loss", simple_value=1.0 / (s + 1))
        w.add_event(event_pb2.Event(wall_time=time.time(), step=s, summary=summary_pb2.Summary(value=[value])))
        if big_every and s % big_every == 0:
            img = summary_pb2.Summary.Image(height=1, width=1, colorspace=3,
                                            encoded_image_string=rng.integers(0, 256, 3000, dtype=np.uint8).tobytes())
            value = summary_pb2.Summary.Value(tag="img", image=img)
            w.add_event(event_pb2.Event(wall_time=time.time(), step=s, summary=summary_pb2.Summary(value=[value])))
    w.close()
    (f,) = logdir.iterdir()
    return f


def _records(data: bytes) -> list[tuple[int, int]]:
    """(offset, data length) of each record: 8 bytes of length, 4 of its CRC, the data, 4 of the data's CRC."""
    out, off = [], 0
    while off < len(data):
        (n,) = struct.unpack_from("<Q", data, off)
        out.append((off, n))
        off += 16 + n
    assert off == len(data)
    return out


def _damaged_copy(f: Path, tmp_path: Path, at: int, xor: int = 0xFF) -> Path:
    data = bytearray(f.read_bytes())
    data[at] ^= xor
    out = tmp_path / "damaged"
    out.mkdir()
    (out / f.name).write_bytes(bytes(data))
    return out / f.name


@pytest.fixture
def event_file(tmp_path: Path) -> Path:
    return _write(tmp_path / "tb")


def test_an_intact_file_reads_whole_without_a_warning(event_file: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = import_tensorboard(event_file)
    assert len(run.steps) == STEPS and "damaged_files" not in run.metadata and run.notes == []


@pytest.mark.parametrize(("where", "part"), [
    ("data", "data"),          # a byte of the event itself
    ("data crc", "data"),      # the stored checksum of the data
    ("length", "length"),      # the length, still pointing inside the file: the framing alone misses it
    ("length crc", "length"),  # the stored checksum of the length
])
def test_a_record_damaged_in_the_middle_is_reported(event_file: Path, tmp_path: Path, where: str, part: str) -> None:
    records = _records(event_file.read_bytes())
    k = len(records) // 2  # record k + 1 (1-based): the file_version record comes first, then step k - 1
    off, n = records[k]
    at = {"data": off + 12 + n // 2, "data crc": off + 12 + n + 1, "length": off, "length crc": off + 9}[where]
    bad = _damaged_copy(event_file, tmp_path, at, xor=0x01 if where == "length" else 0xFF)
    with pytest.warns(LogDamagedWarning, match=rf"damaged event file .*: record {k + 1:,} at byte {off:,} of "
                                               rf"[\d,]+ is damaged \(its {part} fails its CRC check"):
        run = import_tensorboard(bad)
    assert run.steps.tolist() == list(range(k - 1))  # what precedes the damage, all of it
    assert list(run.metadata["damaged_files"]) == [str(bad)]
    note = run.metadata["damaged_files"][str(bad)]
    assert f"after {k:,} good record(s)" in note and "the values it and the rest of the file held are missing" in note
    assert any(n.startswith(f"damaged event file {bad}: record {k + 1:,} at byte {off:,}") for n in run.notes)


def test_the_first_damage_is_the_one_reported(event_file: Path, tmp_path: Path) -> None:
    records = _records(event_file.read_bytes())
    data = bytearray(event_file.read_bytes())
    for k in (100, 300):
        off, n = records[k]
        data[off + 12 + n // 2] ^= 0x10
    bad = tmp_path / event_file.name
    bad.write_bytes(bytes(data))
    assert importers._event_file_damage(bad).startswith(f"record 101 at byte {records[100][0]:,}")


def test_a_file_cut_short_is_still_told_apart(event_file: Path, tmp_path: Path) -> None:
    data = event_file.read_bytes()
    records = _records(data)
    off, n = records[200]
    for cut in (off + 5, off + 12 + n // 2):  # in a record's head, in its data
        short = tmp_path / f"cut{cut}" / event_file.name
        short.parent.mkdir()
        short.write_bytes(data[:cut])
        assert importers._event_file_damage(short) == (
            f"its records end at byte {off:,} of {cut:,} (after 200 complete record(s)); the rest is cut short or "
            "unreadable, and the values it held are missing")


def test_records_longer_than_a_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records are read and checked a block at a time; one longer than a block is read whole."""
    f = _write(tmp_path / "tb", steps=60, big_every=7)
    data = f.read_bytes()
    records = _records(data)
    monkeypatch.setattr(importers, "_CRC_BLOCK", 1000)
    assert importers._event_file_damage(f) is None
    big = [i for i, (_, n) in enumerate(records) if n > 3000]
    for i in (big[3], big[3] + 1):  # a long record, and a short one after it
        off, n = records[i]
        bad = tmp_path / f"bad{i}" / f.name
        bad.parent.mkdir()
        bad.write_bytes(data[:off + 12 + n - 1] + bytes([data[off + 12 + n - 1] ^ 0x80]) + data[off + 12 + n:])
        assert importers._event_file_damage(bad).startswith(f"record {i + 1} at byte {off:,} "), i
    off, n = records[big[3]]
    short = tmp_path / "short" / f.name
    short.parent.mkdir()
    short.write_bytes(data[:off + 2000])
    assert importers._event_file_damage(short).startswith(f"its records end at byte {off:,} ")


def test_the_checksum_is_crc32c() -> None:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

    rng = np.random.default_rng(1)
    lens = np.concatenate([np.arange(0, 140), rng.integers(0, 3000, 60), [4096, 70_000]]).astype(np.int64)
    buf = rng.integers(0, 256, int(lens.sum()) + 3, dtype=np.uint8)
    start = (3 + np.cumsum(lens) - lens).astype(np.int64)
    got = importers._crc32c(buf, start, lens)
    assert got.tolist() == [crc32c(buf[s:s + n].tobytes()) for s, n in zip(start.tolist(), lens.tolist())]
    assert int(importers._crc32c(np.frombuffer(b"123456789", dtype=np.uint8), np.array([0]), np.array([9]))[0]) \
        == 0xE3069283  # the check value of CRC-32C

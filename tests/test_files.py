"""atomic_write: a file is replaced whole or not at all."""

import pytest

from minilm.files import atomic_write, atomic_write_text


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "report.json"
    atomic_write_text(target, "old")

    def fail_midway(f):
        f.write("half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, fail_midway, mode="w")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_write_creates_missing_parent_directories(tmp_path):
    target = tmp_path / "a" / "b" / "out.bin"
    atomic_write(target, lambda f: f.write(b"\x00\x01"))
    assert target.read_bytes() == b"\x00\x01" and [p.name for p in target.parent.iterdir()] == ["out.bin"]

"""Files written whole or not at all (TFLite exports, tfpar tune --json)."""

import os

import pytest

from tfpar._files import check_folder_of, write_atomically


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(b"old")
    write_atomically(str(path), b"new bytes")
    assert path.read_bytes() == b"new bytes"
    assert os.listdir(tmp_path) == ["model.tflite"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "trials.json"
    path.write_text("old")
    with pytest.raises(TypeError):
        write_atomically(str(path), 12345)  # neither str nor bytes: fails while writing
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["trials.json"]


def test_a_file_in_a_missing_folder_is_refused_before_any_work(tmp_path):
    with pytest.raises(
        ValueError, match=r"--json must be a file in an existing folder. Received: --json="
    ):
        check_folder_of("--json", str(tmp_path / "no" / "out.json"))


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask

from __future__ import annotations

import os

import numpy as np
import pytest

from shoal.shm.segment import Segment, unlink_segment, validate_segment_name


def _exists(name: str) -> bool:
    return os.path.exists("/dev/shm" + name)


def test_create_attach_share_bytes_and_owner_close_unlinks(shm_prefix: str) -> None:
    name = shm_prefix + "0"
    owner = Segment.create(name, 4096)
    assert owner.is_owner and owner.size == 4096 and len(owner.buf) == 4096
    owner.buf[10:15] = b"hello"
    reader = Segment.attach(name, readonly=True)
    assert not reader.is_owner and reader.size == 4096
    assert bytes(reader.buf[10:15]) == b"hello"
    assert reader.buf.readonly
    with pytest.raises(TypeError):
        reader.buf[0:1] = b"x"
    writer = Segment.attach(name)
    writer.buf[0:2] = b"ok"
    assert bytes(owner.buf[0:2]) == b"ok"
    reader.close()
    writer.close()
    assert _exists(name)  # a non-owner close never unlinks
    owner.close()
    assert not _exists(name)
    owner.close()  # idempotent


def test_create_refuses_an_existing_name(shm_prefix: str) -> None:
    with Segment.create(shm_prefix + "0", 4096), pytest.raises(FileExistsError):
        Segment.create(shm_prefix + "0", 4096)


def test_attach_missing_segment_raises(shm_prefix: str) -> None:
    with pytest.raises(FileNotFoundError):
        Segment.attach(shm_prefix + "missing")


def test_close_with_live_exported_arrays_does_not_raise(shm_prefix: str) -> None:
    seg = Segment.create(shm_prefix + "0", 4096)
    array = np.frombuffer(seg.buf, dtype=np.uint8, count=16)
    sub_view = seg.buf[0:8]
    array[:] = 7
    seg.close()  # must not raise although exports exist; still unlinks
    assert not _exists(shm_prefix + "0")
    assert seg.closed
    assert int(array.sum()) == 7 * 16  # memory stays mapped while the array lives
    assert bytes(sub_view) == b"\x07" * 8
    with pytest.raises(ValueError):
        _ = seg.buf


def test_stat_sees_truncation(shm_prefix: str) -> None:
    name = shm_prefix + "0"
    with Segment.create(name, 8192) as owner:
        reader = Segment.attach(name, readonly=True)
        assert reader.stat().st_size == 8192
        os.truncate("/dev/shm" + name, 4096)
        assert reader.stat().st_size == 4096
        assert owner.stat().st_size == 4096
        reader.close()


def test_unlink_segment_reports_existence(shm_prefix: str) -> None:
    name = shm_prefix + "0"
    seg = Segment.create(name, 4096)
    assert unlink_segment(name) is True
    assert unlink_segment(name) is False
    assert bytes(seg.buf[:4]) == b"\x00" * 4  # the mapping survives the unlink
    seg.close()


def test_invalid_sizes_and_names(shm_prefix: str) -> None:
    with pytest.raises(ValueError):
        Segment.create(shm_prefix + "0", 0)
    for bad in ("noslash", "/", "/a/b", "/" + "x" * 256, "/a\x00b"):
        with pytest.raises(ValueError):
            validate_segment_name(bad)
    validate_segment_name("/" + "x" * 255)
    validate_segment_name("/shoal-ab12cd34ef56-fe-1234-0")

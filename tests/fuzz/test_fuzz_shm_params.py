"""Fuzzing the ``shared_memory_*`` tensor parameters (``shm_params.py``) and their resolution
against a real registry (``shm_registry`` / ``shm_checks``: slice bounds, byte sizes, the BYTES
framing read from the object): any parameters give a slice or a client error."""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.frontend.core.shm_params import SHM_KEYS, decode_shared_memory
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from tests.fuzz.strategies import ints, json_values
from tests.fuzz.support import (
    DATATYPES,
    REGION_BYTES,
    check_client_outcome,
    examples,
    open_registry,
)

parameters = st.dictionaries(st.one_of(st.sampled_from(SHM_KEYS), st.text(max_size=4)),
                             st.one_of(ints, st.sampled_from(("r", "", "missing")), json_values),
                             max_size=4)
sizes = st.one_of(st.integers(-2, REGION_BYTES + 2), ints)


@pytest.fixture(scope="module")
def region() -> Iterator[tuple[ClientSharedMemoryRegistry, str]]:
    with tempfile.TemporaryDirectory() as directory:
        registry = open_registry(directory)
        yield registry, os.path.join(directory, "region")
        registry.close()


@examples(300)
@given(params=parameters)
def test_any_shared_memory_parameters(params: dict[str, Any]) -> None:
    check_client_outcome(lambda: decode_shared_memory(params, "input 'x'"))


@examples(300)
@given(content=st.binary(max_size=64), offset=sizes, byte_size=sizes,
       datatype=st.sampled_from(DATATYPES), shape=st.lists(st.integers(0, 70), max_size=3),
       name=st.sampled_from(("r", "missing", "")))
def test_resolving_any_slice_of_a_region(region: tuple[ClientSharedMemoryRegistry, str],
                                         content: bytes, offset: int, byte_size: int,
                                         datatype: str, shape: list[int], name: str) -> None:
    """The object's bytes are drawn too: BYTES inputs are checked by reading their framing."""
    registry, path = region
    with open(path, "r+b") as file:
        file.write((struct.pack("<I", len(content)) + content).ljust(REGION_BYTES, b"\x00")
                   [:REGION_BYTES])
    check_client_outcome(lambda: registry.resolve_input(1, name, offset, byte_size, "x",
                                                        datatype, shape))
    check_client_outcome(lambda: registry.resolve_output(1, name, offset, byte_size, "y"))
    registry.release_request(1)

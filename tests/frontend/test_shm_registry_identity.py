"""The frontend registry's owner check at registration, with a fake fstat (an object another
uid owns needs root to create; tests/e2e/test_client_shm_identity.py does it when root)."""

from __future__ import annotations

import os

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from shoal.settings import settings_from_flags
from tests.conftest import MakeObject

ENABLED = settings_from_flags(model_repositories=["/m"], allow_client_shm=True).for_frontends()


def foreign_fstat(fd: int) -> os.stat_result:
    """The real fstat of ``fd`` with another owner."""
    real = os.fstat(fd)
    fields = list(real[:10])
    fields[4] = real.st_uid + 1
    return os.stat_result(fields)


def test_an_object_another_user_owns_is_refused_by_default(make_object: MakeObject) -> None:
    key = make_object(4096)
    registry = ClientSharedMemoryRegistry(ENABLED, stat_of=foreign_fstat)
    with pytest.raises(ShoalError) as info:
        registry.register("theirs", key, 0, 4096)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "'theirs'" in info.value.message
    assert "--client-shm-allow-foreign-owner" in info.value.message
    assert registry.status(None) == []
    registry.close()


def test_the_setting_allows_them(make_object: MakeObject) -> None:
    key = make_object(4096)
    allowing = settings_from_flags(model_repositories=["/m"], allow_client_shm=True,
                                   client_shm_allow_foreign_owner=True).for_frontends()
    registry = ClientSharedMemoryRegistry(allowing, stat_of=foreign_fstat,
                                          euid=os.geteuid() + 1)
    registry.register("theirs", key, 0, 4096)
    ref = registry.resolve_input(1, "theirs", 0, 16, "IN", "FP32", [4])
    assert ref.object_id == os.stat("/dev/shm" + key).st_ino
    registry.release_request(1)
    registry.close()


def test_a_use_by_a_server_of_another_uid_is_refused(make_object: MakeObject) -> None:
    """At every use the key's object is checked again, owner included."""
    key = make_object(4096)
    registry = ClientSharedMemoryRegistry(ENABLED, euid=os.geteuid() + 1,
                                          stat_of=lambda fd: os.stat_result(
                                              (*os.fstat(fd)[:4], os.geteuid() + 1,
                                               *os.fstat(fd)[5:10])))
    registry.register("r", key, 0, 4096)  # the fake fstat says it is the server's
    with pytest.raises(ShoalError) as info:
        registry.resolve_input(1, "r", 0, 16, "IN", "FP32", [4])
    assert "'r'" in info.value.message and "owned by another user" in info.value.message
    registry.close()

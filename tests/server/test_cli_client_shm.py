"""--client-shm-allow-foreign-owner: parsed in tritonserver's boolean style and handed to the
frontends (Settings) and the workers (WorkerSettings)."""

from __future__ import annotations

import pytest

from shoal.server.cli import build_parser, settings_from_args
from shoal.settings import Settings


def parsed(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", "--model-repository=/m",
                                                         *argv]))


@pytest.mark.parametrize(("argv", "allowed"), [
    ((), False),
    (("--client-shm-allow-foreign-owner",), True),
    (("--client-shm-allow-foreign-owner=true",), True),
    (("--client-shm-allow-foreign-owner=false",), False),
])
def test_the_flag_reaches_frontends_and_workers(argv: tuple[str, ...], allowed: bool) -> None:
    settings = parsed(*argv)
    assert settings.client_shm.allow_foreign_owner is allowed
    assert settings.for_workers().client_shm.allow_foreign_owner is allowed
    assert Settings.from_json(settings.to_json()).client_shm.allow_foreign_owner is allowed


def test_a_bad_value_is_refused() -> None:
    with pytest.raises(SystemExit):
        parsed("--client-shm-allow-foreign-owner=perhaps")

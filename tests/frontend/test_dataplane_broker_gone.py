"""A frontend whose broker exited reports itself neither live nor ready (health checks, HTTP
and gRPC, read these), from the moment it learns of the death until the supervisor stops it."""

from __future__ import annotations

import asyncio
import pathlib

from shoal.frontend.core.dataplane_impl import FrontendDataPlane
from shoal.settings import settings_from_flags
from shoal.shm.sweep import new_instance_id


def test_live_and_ready_turn_false_when_the_broker_exits(tmp_path: pathlib.Path) -> None:
    settings = settings_from_flags(model_repositories=[str(tmp_path)], runtime_dir=str(tmp_path),
                                   instance_id=new_instance_id(),
                                   strict_readiness=False).for_frontends()

    async def main() -> None:
        dataplane = FrontendDataPlane(settings)
        try:
            assert dataplane.is_live()
            dataplane.client.broker_exited()
            assert not dataplane.is_live()
            assert not dataplane.is_ready()
        finally:
            await dataplane.close()

    asyncio.run(main())

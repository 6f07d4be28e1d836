"""Server settings: parsed once by the CLI (``server/cli.py``) into ``Settings``, one typed
struct per concern (``settings/concerns.py``: HTTP, gRPC, shared memory, model control, ...).
Each process is given the concerns it reads (``settings/process.py``): the broker
``BrokerSettings`` and each frontend ``FrontendSettings`` as JSON in its argv, each worker
``WorkerSettings`` inside its ``WorkerSpec``. Nothing below the entry functions reads the
environment or argv.

Names follow ``tritonserver``'s flags where the concept is the same.
"""

from shoal.settings.concerns import (
    BackendSettings,
    ClientShmSettings,
    GrpcSettings,
    HttpSettings,
    InstanceSettings,
    LogSettings,
    MetricsSettings,
    ModelControlMode,
    ModelControlSettings,
    RateLimitSettings,
    ShmSettings,
    WorkerWatchSettings,
)
from shoal.settings.process import (
    FLAT_FIELDS,
    BrokerSettings,
    FrontendSettings,
    Settings,
    WorkerSettings,
    settings_from_flags,
)

__all__ = [
    "FLAT_FIELDS", "BackendSettings", "BrokerSettings", "ClientShmSettings", "FrontendSettings",
    "GrpcSettings", "HttpSettings", "InstanceSettings", "LogSettings", "MetricsSettings",
    "ModelControlMode", "ModelControlSettings", "RateLimitSettings", "Settings", "ShmSettings",
    "WorkerSettings", "WorkerWatchSettings", "settings_from_flags",
]

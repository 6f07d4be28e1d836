"""The fuzzing property and its bounds, shared by the Hypothesis tests and the atheris harnesses.

The property: a parser given any input either succeeds or raises ``ShoalError`` whose code maps to
a 4xx HTTP status (``CLIENT_CODES``); anything else (another exception type, which the frontend
answers with 500, a crash, or a hang) is a bug. Hangs are bounded per example by
``time_bound``: a CPU-time alarm (``ITIMER_PROF``, so it does not disturb pytest-timeout's
``SIGALRM``) that raises ``ExampleTimeout`` in the main thread.

Hypothesis profiles (``SHOAL_FUZZ_PROFILE``): ``ci`` (default) is derandomized and sized so the
whole directory runs in well under a minute on two cores; ``long`` draws ``LONG_FACTOR`` times
as many random examples per test and keeps its failure database in ``.hypothesis/``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Final, TypeVar

import msgspec
from hypothesis import HealthCheck, settings

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.core.dataplane import InferOutcome
from shoal.frontend.core.decoded import DecodedRequest
from shoal.frontend.core.prepare import prepare_request
from shoal.frontend.core.validation import validate_request
from shoal.frontend.http.errors import HTTP_STATUS
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from shoal.messages import InferRequest, ModelVersionInfo, TensorSpec, encode
from shoal.settings import settings_from_flags
from shoal.shm.arena import Slot
from tests.frontend.http.fakes import FakeDataPlane, make_model

_T = TypeVar("_T")

CLIENT_CODES: Final = frozenset(code for code, status in HTTP_STATUS.items() if status < 500)
PROFILE: Final = os.environ.get("SHOAL_FUZZ_PROFILE", "ci")
LONG_FACTOR: Final = 100
EXAMPLE_SECONDS: Final = float(os.environ.get("SHOAL_FUZZ_EXAMPLE_SECONDS", "5"))
DATATYPES: Final = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                    "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16")

_SUPPRESSED: Final = [HealthCheck.too_slow, HealthCheck.data_too_large,
                      HealthCheck.filter_too_much, HealthCheck.large_base_example,
                      HealthCheck.function_scoped_fixture]
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          print_blob=True, suppress_health_check=_SUPPRESSED)
settings.register_profile("long", derandomize=False, deadline=None, print_blob=True,
                          suppress_health_check=_SUPPRESSED)
settings.load_profile(PROFILE)


def examples(count: int) -> settings:
    """``@examples(n)``: n examples under the ci profile, ``LONG_FACTOR`` * n under long."""
    return settings(max_examples=count * (LONG_FACTOR if PROFILE == "long" else 1))


class ExampleTimeout(BaseException):
    """One example ran past its CPU-time bound. A BaseException so that no ``except Exception``
    on the path under test (the app's 500 handler) can swallow it."""


def _on_timeout(signum: int, frame: FrameType | None) -> None:
    raise ExampleTimeout(f"example ran for more than {EXAMPLE_SECONDS} s of CPU time (a hang)")


@contextlib.contextmanager
def time_bound(seconds: float = EXAMPLE_SECONDS) -> Iterator[None]:
    """Raise ExampleTimeout in the main thread once the process has used ``seconds`` of CPU
    time inside the block."""
    previous = signal.signal(signal.SIGPROF, _on_timeout)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def check_client_outcome(call: Callable[[], _T],
                         also: frozenset[ErrorCode] = frozenset()) -> _T | ShoalError:
    """Run ``call`` under the time bound: its result, or the ShoalError it raised when that
    error is a client error (or its code is in ``also``). Any other exception propagates (the
    example fails)."""
    try:
        with time_bound():
            return call()
    except ExampleTimeout as timeout:  # now an Exception, so that Hypothesis shrinks it
        raise AssertionError(str(timeout)) from None
    except ShoalError as error:
        assert error.code in CLIENT_CODES | also, f"{error!r} would be a 5xx"
        assert isinstance(error.message, str) and error.message
        return error


# ------------------------------------------------------------------ the models requests target

EVERY_TYPE: Final = tuple(t for t in DATATYPES if t != "BF16")
MODELS: Final[tuple[ModelVersionInfo, ...]] = (
    make_model("identity", [TensorSpec("INPUT0", "FP32", [-1])]),
    make_model("batched", [TensorSpec("INPUT0", "INT32", [4])], max_batch_size=8),
    make_model("all_types", [TensorSpec(f"IN_{t}", t, [-1], optional=True)
                             for t in (*EVERY_TYPE, "BF16")]),
    make_model("text", [TensorSpec("INPUT0", "BYTES", [1])]),
    make_model("grid", [TensorSpec("INPUT0", "UINT8", [2, -1]),
                        TensorSpec("INPUT1", "INT64", [-1, 3], optional=True)],
               max_batch_size=4),
)
MODEL_BY_NAME: Final = {model.name: model for model in MODELS}
INPUT_NAMES: Final = tuple(sorted({s.name for m in MODELS for s in m.inputs}))
OUTPUT_NAMES: Final = tuple(sorted({s.name for m in MODELS for s in m.outputs}))


# ------------------------------------------------------------------ a DataPlane to forward to

REGION_BYTES: Final = 256


@dataclass
class FuzzDataPlane(FakeDataPlane):
    """The in-test echo DataPlane plus a real client shared-memory registry (region ``r``, see
    ``open_registry``); ``infer`` first encodes the request exactly as it would be sent to the
    broker, so a request that cannot cross the wire fails the example."""

    shared_memory: ClientSharedMemoryRegistry | None = None
    shm_directory: str = ""  # where the registry's objects are (client inputs are read there)

    def __repr__(self) -> str:
        return "FuzzDataPlane()"

    async def infer(self, request: InferRequest, slots: list[Slot]) -> InferOutcome:
        encode(request)
        client = [ref for ref in request.inputs if not ref.region.startswith("/fake-")]
        if client:  # inputs in a client region: echoed as the worker would read them
            request = msgspec.structs.replace(request, inputs=[
                ref for ref in request.inputs if ref.region.startswith("/fake-")])
            for ref in client:
                with open(os.path.join(self.shm_directory, ref.region[1:]), "rb") as file:
                    data = os.pread(file.fileno(), ref.nbytes, ref.offset)
                slot = self.allocate(ref.nbytes)
                slot.view[:len(data)] = data
                slots.append(slot)
                request.inputs.append(msgspec.structs.replace(
                    ref, region=slot.region, offset=slot.offset))
        return await super().infer(request, slots)


def open_registry(directory: str) -> ClientSharedMemoryRegistry:
    """A registry whose objects live in ``directory`` (standing in for /dev/shm), with region
    ``r`` registered over a 256-byte object that starts with two BYTES elements."""
    content = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0)
    with open(os.path.join(directory, "region"), "wb") as file:
        file.write(content.ljust(REGION_BYTES, b"\x00"))
    registry = ClientSharedMemoryRegistry(
        settings_from_flags(model_repositories=["/m"],
                            allow_client_shm=True).for_frontends(), shm_directory=directory)
    registry.register("r", "/region", 0, REGION_BYTES)
    return registry


def forward(dataplane: FuzzDataPlane, decoded: DecodedRequest, model: ModelVersionInfo) -> None:
    """What the frontend does with a decoded request short of queueing it: validate, place the
    inputs (resolving client regions), build the InferRequest and encode it for the wire; then
    undo the placement."""
    plan = validate_request(decoded, model)
    prepared = prepare_request(dataplane, decoded, plan, model)
    try:
        encode(prepared.request)
    finally:
        for slot in prepared.slots:
            dataplane.free(slot)
        if dataplane.shared_memory is not None:
            dataplane.shared_memory.release_request(prepared.request.request_id)

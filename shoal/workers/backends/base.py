"""The backend contract (docs/architecture.md §7): what a worker process asks of a model
implementation.

A worker owns exactly one backend instance for one model instance on one device. The worker maps
input tensors from shared memory into numpy views, calls ``execute`` with every request of a
batch, and copies the returned arrays into its output arena. Threads: all three methods are
called from the worker's main thread only.

Ownership: input arrays in ``BackendRequest.inputs`` are views of shared memory owned by the
frontend (or of a client's CUDA allocation); they are valid only until ``execute`` returns (copy
to keep). Returned arrays are owned by the backend until the worker has copied them (before the
next ``execute``).

Device tensors (CUDA shared-memory extension): a backend that can take an input as a torch tensor
on its instance's device defines ``takes_device_input(name) -> bool`` (optional; looked up with
``takes_device_input`` below, absent means False). An input a client placed in CUDA memory then
arrives as a typed torch tensor on the device (zero copy when possible) instead of a host array.
An output the backend returns as a torch tensor (any device) is copied by the worker: tensor to
tensor into a client's CUDA region, else to the host first.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from shoal.messages import Error, LlmStats, Params

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from shoal.workers.bls.client import BlsClient

ResponseSink = Callable[[int, "BackendResponse | Error | None", bool], None]
CancelProbe = Callable[[int], bool]


@dataclass(frozen=True)
class InstanceContext:
    """Everything a backend learns at load.

    ``model_dir`` is ``<repo>/<model>`` (Triton's ``args['model_repository']``);
    ``version_dir`` is ``<repo>/<model>/<version>``. ``config`` is the completed, normalized
    ``model_config_pb2.ModelConfig``; ``config_json`` its Triton /config JSON text.
    ``instance_name`` is Triton's ``<group name>_<index in group>`` (e.g. ``add_sub_0_0``).
    ``kind`` is "CPU", "GPU" or "MODEL"; ``device`` is the torch device string ("cpu",
    "cuda:0", "npu:0"); ``device_id`` is the accelerator index (0 for CPU).
    ``backend_settings`` holds ``--backend-config=<this backend>,k=v`` pairs (plus global ones).
    """

    model_name: str
    model_version: int
    model_dir: str
    version_dir: str
    config: ModelConfig  # typed by the generated stub in typings/
    config_json: str
    instance_name: str
    kind: str
    device: str
    device_id: int
    backend_settings: dict[str, str] = field(default_factory=dict)
    # Decoupled models: send one response of request ``request_id`` now, from any thread;
    # ``final`` ends the request (``response`` None + final: end without a response).
    send_response: ResponseSink | None = None
    # Decoupled models: ``with ctx.stream_batch():`` the responses this thread sends inside go
    # to the broker as one message when the block ends (many requests answered at once).
    stream_batch: Callable[[], AbstractContextManager[None]] | None = None
    # True once the client cancelled request ``request_id`` (thread-safe).
    is_cancelled: CancelProbe | None = None
    # Calls to other models of the server (BLS) and model control; connects on first use.
    bls: BlsClient | None = None
    # Non-decoupled models: a writable view of ``nbytes`` bytes of the worker's output arena,
    # for an output the backend writes before returning it (the worker then references it where
    # it is instead of copying it; ``workers/output_lending.py``). None outside a batch
    # (warmup) or when the worker has no arena to lend.
    lend_output: Callable[[int], memoryview | None] | None = None
    # The server's thread policy for this CPU instance (broker/thread_policy.py): the intra-op
    # threads to use when neither the model's parameters nor --backend-config name a count.
    # 0: no policy (accelerator instances): the backend keeps its own default.
    default_intra_op_threads: int = 0
    # Bytes the worker's shared-memory output arena can still take (its --shm-arena-byte-size
    # less what live answers hold): the python backend's ``c_python_backend_utils`` reports it.
    shm_free_bytes: Callable[[], int] | None = None


@dataclass
class BackendRequest:
    """One inference request. ``inputs`` maps input name -> array of the request's full shape
    (batch dim included when the model batches). BYTES inputs are object arrays of ``bytes``;
    BF16 inputs are ``uint16`` arrays of bit patterns (see ``input_datatypes``). A value may
    instead be a torch tensor on the instance's device (BF16: ``torch.bfloat16``), for inputs
    the backend said it takes that way (``takes_device_input``) and the client placed in CUDA
    memory. ``device_outputs`` names the requested outputs the client wants in CUDA memory (a
    backend may return those as device tensors to save a trip through the host)."""

    request_id: int
    inputs: dict[str, npt.NDArray[Any]]
    input_datatypes: dict[str, str]
    requested_outputs: list[str]
    parameters: Params
    client_request_id: str = ""
    batch_size: int = 1
    correlation_id: int | str = 0
    flags: int = 0
    device_outputs: frozenset[str] = frozenset()


@dataclass
class OutputTensor:
    name: str
    datatype: str  # wire name; BYTES arrays may be object/bytes/str arrays
    array: npt.NDArray[Any]  # or a torch tensor (any device; see the module docstring)


@dataclass
class BackendResponse:
    """Outputs of one request (all the model produced; the worker filters by the requested
    names) and response parameters."""

    outputs: list[OutputTensor]
    parameters: Params = field(default_factory=dict)


class Rescheduled(enum.Enum):
    """An ``execute`` answer: the model released the request with RESCHEDULE (an iterative
    sequence, ``sequence_batching { iterative_sequence: true }``). It gets no answer now: the
    broker runs it again on this instance in a later batch (``broker/schedulers/iterative.py``);
    a decoupled request's stream stays open meanwhile."""

    RESCHEDULED = "rescheduled"


RESCHEDULED: Final = Rescheduled.RESCHEDULED

Answer = BackendResponse | Error | Rescheduled | None  # one request's, from ``execute``


class Backend(Protocol):
    """Optional members, looked up with ``getattr``: ``takes_device_input(name) -> bool`` (see
    the module docstring and ``takes_device_input``); ``llm_stats() -> LlmStats | None`` (see
    ``llm_stats``)."""

    def load(self, ctx: InstanceContext) -> None:
        """Load the model; raise ShoalError (or any exception) to fail the load."""

    def execute(self, requests: list[BackendRequest]) -> Sequence[Answer]:
        """Run the requests (one list entry per request, same order). A per-request problem is
        an ``Error`` in its slot; an exception fails the whole batch. ``RESCHEDULED``: run it
        again later (iterative sequences). ``None`` means the request
        answers through ``InstanceContext.send_response`` (decoupled models), possibly after
        execute returned."""
        ...

    def unload(self) -> None:
        """Finalize. Called once at shutdown; must not raise."""


def takes_device_input(backend: object, name: str) -> bool:
    """Whether ``backend`` takes input ``name`` as a device tensor (its optional
    ``takes_device_input`` method; False when it has none)."""
    probe = getattr(backend, "takes_device_input", None)
    return bool(probe(name)) if callable(probe) else False


def llm_stats(backend: object) -> LlmStats | None:
    """An llm backend's executor figures (its optional ``llm_stats`` method, called from the
    worker's control thread, so it must be thread-safe); None for other backends or before
    the load."""
    probe = getattr(backend, "llm_stats", None)
    if not callable(probe):
        return None
    stats = probe()
    return stats if isinstance(stats, LlmStats) else None


def empty_array() -> npt.NDArray[np.float32]:
    return np.zeros(0, dtype=np.float32)

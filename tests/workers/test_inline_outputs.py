"""Small streamed responses ride inline: ``OutputWriter.write_one`` puts the bytes of a
response of at most ``INLINE_MAX_BYTES`` in its TensorRefs (no arena slot, no lease); larger
ones, and batches, still go through the arena under a lease."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from shoal.dtypes import deserialize_bytes
from shoal.messages import RequestedOutput, StreamResponse, decode, encode
from shoal.shm.arena import Arena
from shoal.shm.client_regions import ClientRegions
from shoal.workers.backends.base import BackendResponse, OutputTensor
from shoal.workers.device_regions import DeviceRegions, LazyCudaIpc
from shoal.workers.outputs import INLINE_MAX_BYTES, OutputWriter


@pytest.fixture
def parts(shm_prefix: str) -> Iterator[tuple[Arena, OutputWriter]]:
    arena = Arena(shm_prefix + "w-", 1 << 16, 1 << 20)
    yield arena, OutputWriter("w", arena, ClientRegions(), DeviceRegions(LazyCudaIpc()))
    arena.close()


def token_response() -> BackendResponse:
    """What the llm backend streams per token: text plus the three counts."""
    return BackendResponse([
        OutputTensor("text_output", "BYTES", np.array([b" w42"], dtype=np.object_)),
        OutputTensor("prompt_tokens", "INT32", np.array([24], np.int32)),
        OutputTensor("completion_tokens", "INT32", np.array([7], np.int32)),
        OutputTensor("finish_reason", "BYTES", np.array([b""], dtype=np.object_))])


def test_a_small_streamed_response_carries_its_bytes_without_slot_or_lease(
        parts: tuple[Arena, OutputWriter]) -> None:
    arena, writer = parts
    refs, _, lease = writer.write_one([], token_response())
    assert lease is None and arena.used_bytes == 0 and len(writer) == 0
    assert [r.name for r in refs] == ["text_output", "prompt_tokens", "completion_tokens",
                                      "finish_reason"]
    assert all(r.region == "" and r.inline is not None and len(r.inline) == r.nbytes
               for r in refs)
    text, prompt, completion, reason = refs
    assert text.inline is not None and deserialize_bytes(text.inline) == [b" w42"]
    assert prompt.inline is not None and np.frombuffer(prompt.inline, np.int32).tolist() == [24]
    assert completion.inline is not None and completion.shape == [1]
    assert np.frombuffer(completion.inline, np.int32).tolist() == [7]
    assert reason.inline is not None and deserialize_bytes(reason.inline) == [b""]


def test_inline_bytes_survive_the_wire(parts: tuple[Arena, OutputWriter]) -> None:
    _, writer = parts
    refs, parameters, lease = writer.write_one([RequestedOutput("prompt_tokens")],
                                               token_response())
    message = StreamResponse(5, refs, parameters, None, lease, False)
    back = decode(encode(message))
    assert isinstance(back, StreamResponse)
    assert back.outputs == refs and back.lease is None


def test_a_larger_streamed_response_goes_to_the_arena_under_a_lease(
        parts: tuple[Arena, OutputWriter]) -> None:
    arena, writer = parts
    big = np.arange(INLINE_MAX_BYTES // 4 + 1, dtype=np.float32)
    refs, _, lease = writer.write_one([], BackendResponse([OutputTensor("Y", "FP32", big)]))
    assert lease is not None and arena.used_bytes > 0
    assert refs[0].inline is None and refs[0].region != "" and refs[0].nbytes == big.nbytes
    writer.release(lease.lease_id)
    assert arena.used_bytes == 0


def test_batches_keep_their_arena_lease(parts: tuple[Arena, OutputWriter]) -> None:
    arena, writer = parts
    results, lease = writer.write_results([1], [[]], [token_response()])
    assert lease is not None and all(r.inline is None for r in results[0].outputs)
    writer.release(lease.lease_id)
    assert arena.used_bytes == 0


def test_outputs_of_no_elements_take_no_slot_streamed_or_batched(
        parts: tuple[Arena, OutputWriter]) -> None:
    """A tensor with a 0 dimension (and a BYTES tensor of no elements) has no bytes: it rides
    inline empty, and a response of nothing else holds no lease (Triton answers these)."""
    arena, writer = parts
    empty = BackendResponse([
        OutputTensor("F", "FP32", np.zeros((0, 3), np.float32)),
        OutputTensor("S", "BYTES", np.zeros((1, 0), np.object_))])
    refs, _, lease = writer.write_one([], empty)
    assert lease is None and arena.used_bytes == 0
    assert [(r.shape, r.nbytes, r.inline, r.region) for r in refs] == \
        [([0, 3], 0, b"", ""), ([1, 0], 0, b"", "")]
    results, lease = writer.write_results([1, 2], [[], []], [empty, token_response()])
    assert [(r.shape, r.inline) for r in results[0].outputs] == [([0, 3], b""), ([1, 0], b"")]
    assert lease is not None and len(writer) == 1  # only the second response holds it
    writer.release(lease.lease_id)
    assert arena.used_bytes == 0

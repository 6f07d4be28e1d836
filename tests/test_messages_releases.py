"""The ``releases`` fields of InferRequestBatch and Batch (issue #16 part 4): they round-trip,
and a message encoded before the field existed reads as carrying none."""

from __future__ import annotations

import msgspec

from shoal.messages import (
    Batch,
    InferRequest,
    InferRequestBatch,
    Lease,
    TensorRef,
    WorkerRequest,
    decode,
    encode,
)

REF = TensorRef("X", "FP32", [4], "r", 0, 16)
LEASES = [Lease("m:1:0:1", 3), Lease("m:1:0:1", 4)]


def test_releases_round_trip() -> None:
    batch = InferRequestBatch([InferRequest(1, "m", -1, [REF])], LEASES)
    assert decode(encode(batch)) == batch
    work = Batch(7, [WorkerRequest(1, [REF])], releases=LEASES)
    assert decode(encode(work)) == work


def test_a_message_without_releases_reads_as_none() -> None:
    # InferRequestBatch was [requests] and Batch [batch_id, requests, rows, controls]: a sender
    # that knows no releases (a BLS link, an older peer) is read as giving none back
    requests = [InferRequest(1, "m", -1, [REF])]
    kind = encode(InferRequestBatch(requests))[0]
    assert decode([kind, msgspec.msgpack.encode([requests])]) == InferRequestBatch(requests)
    work = [WorkerRequest(1, [REF])]
    kind = encode(Batch(7, work))[0]
    assert decode([kind, msgspec.msgpack.encode([7, work, [], []])]) == Batch(7, work)
    assert decode([kind, msgspec.msgpack.encode([7, work])]) == Batch(7, work)

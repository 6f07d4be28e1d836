"""The request key: equal for equal requests, different when anything the answer depends on
differs."""

from __future__ import annotations

from shoal.frontend.response_cache.keys import request_key
from shoal.messages import InferRequest, RequestedOutput, TensorRef

_DATA = {"a": b"\x00\x00\x80?", "b": b"\x00\x00\x00@"}


def _request(data: str = "a", *, model: str = "m", version: int = 1, name: str = "IN",
             datatype: str = "FP32", shape: tuple[int, ...] = (1,),
             outputs: tuple[str, ...] = (), parameters: dict[str, str] | None = None,
             request_id: int = 1) -> InferRequest:
    return InferRequest(
        request_id=request_id, model=model, version=version,
        inputs=[TensorRef(name, datatype, list(shape), data, 0, 4)],
        outputs=[RequestedOutput(o) for o in outputs], parameters=dict(parameters or {}))


def _key(request: InferRequest) -> bytes | None:
    return request_key(request, lambda ref: _DATA[ref.region])


def test_equal_requests_have_equal_keys_whatever_their_ids_and_regions() -> None:
    first = _request(request_id=1)
    second = InferRequest(request_id=99, model="m", version=1,
                          inputs=[TensorRef("IN", "FP32", [1], "elsewhere", 64, 4)])
    assert request_key(second, lambda ref: _DATA["a"]) == _key(first)
    assert len(_key(first) or b"") == 32


def test_every_part_of_the_request_changes_the_key() -> None:
    base = _key(_request())
    variants = [
        _request("b"), _request(model="n"), _request(version=2), _request(name="IN2"),
        _request(datatype="INT32"), _request(shape=(1, 1)), _request(outputs=("OUT",)),
        _request(parameters={"p": "x"}),
    ]
    keys = [_key(v) for v in variants]
    assert base not in keys
    assert len(set(keys)) == len(keys)


def test_an_unreadable_input_means_no_key() -> None:
    assert request_key(_request(), lambda ref: None) is None


def test_a_reloaded_version_keys_apart_from_the_one_it_replaced() -> None:
    request = _request()
    before = request_key(request, lambda ref: _DATA["a"], generation=7)
    after = request_key(request, lambda ref: _DATA["a"], generation=8)
    assert before is not None and after is not None and before != after

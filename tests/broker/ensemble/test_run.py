from __future__ import annotations

import pytest

from shoal.broker.ensemble import EnsembleRun, StepCall, step_request, validate_ensemble
from shoal.errors import ErrorCode
from shoal.messages import Error, InferRequest, OutputTarget, RequestedOutput

from .helpers import (
    CLASSES,
    IMAGE_DIMS,
    diamond_plan,
    docs_plan,
    ensemble,
    io,
    lease,
    model,
    output,
    ref,
    step,
)

IMAGE = ref("IMAGE", "BYTES", [2, 1])
BATCH = 2
PREPROCESSED = output("PREPROCESSED_OUTPUT", [BATCH, *IMAGE_DIMS], "pre")
SCORES = output("CLASSIFICATION_OUTPUT", [BATCH, CLASSES], "cls")
MASK = output("SEGMENTATION_OUTPUT", [BATCH, *IMAGE_DIMS], "seg")


def docs_run(**kwargs: object) -> EnsembleRun:
    return EnsembleRun(docs_plan(), {"IMAGE": IMAGE}, batch_size=BATCH,
                       **kwargs)  # type: ignore[arg-type]


def models(calls: list[StepCall]) -> list[str]:
    return [call.model_name for call in calls]


def run_preprocess(run: EnsembleRun) -> None:
    (call,) = run.ready_steps()
    run.on_step_done(call.step, {"PREPROCESSED_OUTPUT": PREPROCESSED}, lease("pre"))


# ------------------------------------------------------------------ readiness and results


def test_docs_ensemble_runs_both_branches_together_after_preprocessing() -> None:
    run = docs_run()
    first = run.ready_steps()
    assert models(first) == ["preprocess"]
    assert run.ready_steps() == []  # issued once
    run.on_step_done(0, {"PREPROCESSED_OUTPUT": PREPROCESSED}, lease("pre"))
    branches = run.ready_steps()
    assert models(branches) == ["classify", "segment"]
    assert run.in_flight() == [1, 2]
    run.on_step_done(2, {"SEGMENTATION_OUTPUT": MASK}, lease("seg"))
    assert not run.finished()
    run.on_step_done(1, {"CLASSIFICATION_OUTPUT": SCORES}, lease("cls"))
    assert run.finished()
    result = run.result()
    assert isinstance(result, dict)
    assert {name: t.region for name, t in result.items()} == {
        "CLASSIFICATION": "/shoal-test-cls", "SEGMENTATION": "/shoal-test-seg"}


def test_diamond_join_waits_for_both_branches() -> None:
    run = EnsembleRun(diamond_plan(), {"IMAGE": IMAGE}, batch_size=BATCH)
    run_preprocess(run)
    assert models(run.ready_steps()) == ["classify", "segment"]
    run.on_step_done(1, {"CLASSIFICATION_OUTPUT": SCORES}, lease("cls"))
    assert run.ready_steps() == []
    run.on_step_done(2, {"SEGMENTATION_OUTPUT": MASK}, lease("seg"))
    (join,) = run.ready_steps()
    assert join.model_name == "combine"
    assert {name: t.region for name, t in join.inputs.items()} == {
        "SCORES": "/shoal-test-cls", "MASK": "/shoal-test-seg"}
    summary = output("SUMMARY", [BATCH, CLASSES], "comb")
    run.on_step_done(3, {"SUMMARY": summary}, lease("comb"))
    result = run.result()
    assert isinstance(result, dict) and result["SUMMARY"].region == "/shoal-test-comb"


def test_step_calls_use_composing_names_and_results_use_ensemble_names() -> None:
    run = docs_run()
    (pre,) = run.ready_steps()
    assert (pre.model_version, pre.batch_size) == (-1, BATCH)
    assert list(pre.inputs) == ["RAW_IMAGE"]
    assert pre.inputs["RAW_IMAGE"].name == "RAW_IMAGE"
    assert pre.inputs["RAW_IMAGE"].region == IMAGE.region
    assert [o.name for o in pre.outputs] == ["PREPROCESSED_OUTPUT"]
    run.on_step_done(0, {"PREPROCESSED_OUTPUT": PREPROCESSED}, lease("pre"))
    classify, _segment = run.ready_steps()
    assert classify.inputs["FORMATTED_IMAGE"].name == "FORMATTED_IMAGE"
    assert classify.inputs["FORMATTED_IMAGE"].shape == [BATCH, *IMAGE_DIMS]
    assert [o.name for o in classify.outputs] == ["CLASSIFICATION_OUTPUT"]
    run.on_step_done(1, {"CLASSIFICATION_OUTPUT": SCORES}, lease("cls"))
    run.on_step_done(2, {"SEGMENTATION_OUTPUT": MASK}, lease("seg"))
    result = run.result()
    assert isinstance(result, dict)
    assert result["CLASSIFICATION"].name == "CLASSIFICATION"
    assert result["CLASSIFICATION"].shape == [BATCH, CLASSES]
    assert sorted(run.result_leases(), key=str) == [lease("cls"), lease("seg")]


def test_only_steps_behind_requested_outputs_run() -> None:
    run = docs_run(requested_outputs=[RequestedOutput("CLASSIFICATION")])
    run_preprocess(run)
    assert models(run.ready_steps()) == ["classify"]
    run.on_step_done(1, {"CLASSIFICATION_OUTPUT": SCORES}, lease("cls"))
    assert run.finished()
    result = run.result()
    assert isinstance(result, dict) and list(result) == ["CLASSIFICATION"]


def test_client_output_target_is_passed_to_the_step_that_writes_it() -> None:
    target = OutputTarget("/client-region", 64, 4 * BATCH * CLASSES)
    run = docs_run(requested_outputs=[RequestedOutput("CLASSIFICATION", target=target)])
    run_preprocess(run)
    (classify,) = run.ready_steps()
    assert classify.outputs == [RequestedOutput("CLASSIFICATION_OUTPUT", target=target)]


# ------------------------------------------------------------------ failures


def test_failing_step_fails_the_run_naming_the_step_after_in_flight_steps_end() -> None:
    run = EnsembleRun(diamond_plan(), {"IMAGE": IMAGE}, batch_size=BATCH)
    run_preprocess(run)
    run.ready_steps()
    run.on_step_done(1, Error(ErrorCode.INTERNAL, "boom"))
    expected = Error(ErrorCode.INTERNAL, "in ensemble 'd', step 1 (model 'classify'): boom")
    assert run.error == expected
    assert not run.finished()  # segment is still running and reads the intermediate
    assert run.in_flight() == [2]
    run.on_step_done(2, {"SEGMENTATION_OUTPUT": MASK}, lease("seg"))
    assert run.ready_steps() == []  # the join is never issued
    assert run.finished()
    assert run.result() == expected


def test_memory_of_a_failed_run_is_all_released() -> None:
    run = EnsembleRun(diamond_plan(), {"IMAGE": IMAGE}, batch_size=BATCH)
    run_preprocess(run)
    run.ready_steps()
    run.on_step_done(1, Error(ErrorCode.INTERNAL, "boom"))
    assert run.held_refs() == [PREPROCESSED]  # segment still reads it
    assert run.releasable_leases() == []
    run.on_step_done(2, {"SEGMENTATION_OUTPUT": MASK}, lease("seg"))
    assert run.held_refs() == []
    assert sorted(run.releasable_leases(), key=str) == [lease("pre"), lease("seg")]
    assert run.result_leases() == []


def test_output_kept_for_a_step_that_will_never_run_is_released_on_failure() -> None:
    run = EnsembleRun(diamond_plan(), {"IMAGE": IMAGE}, batch_size=BATCH)
    run_preprocess(run)
    run.ready_steps()
    run.on_step_done(1, {"CLASSIFICATION_OUTPUT": SCORES}, lease("cls"))
    assert run.held_refs() == [PREPROCESSED, SCORES]  # the join will read the scores
    run.on_step_done(2, Error(ErrorCode.UNAVAILABLE, "instance died"))
    assert run.finished()
    assert run.releasable_refs() == [PREPROCESSED, SCORES]
    assert run.releasable_leases() == [lease("pre"), lease("cls")]


def test_cancel_ends_the_run_once_running_steps_return() -> None:
    run = docs_run()
    run.ready_steps()
    cancelled = Error(ErrorCode.CANCELLED, "request cancelled")
    run.cancel(cancelled)
    assert run.ready_steps() == [] and not run.finished()
    run.on_step_done(0, {"PREPROCESSED_OUTPUT": PREPROCESSED}, lease("pre"))
    assert run.ready_steps() == []
    assert run.result() == cancelled
    assert run.releasable_leases() == [lease("pre")]


def test_produced_tensor_that_does_not_fit_the_consumer_fails_before_dispatch() -> None:
    a = model("a", io("X", "TYPE_FP32", [4]), io("Y", "TYPE_FP32", [-1]))
    b = model("b", io("X", "TYPE_FP32", [4]), io("Y", "TYPE_FP32", [4]))
    config = ensemble("e", io("IN", "TYPE_FP32", [4]), io("OUT", "TYPE_FP32", [4]),
                      [step("a", {"X": "IN"}, {"Y": "mid"}), step("b", {"X": "mid"}, {"Y": "OUT"})])
    run = EnsembleRun(validate_ensemble(config, {"a": a, "b": b}),
                      {"IN": ref("IN", "FP32", [1, 4])})
    run.ready_steps()
    run.on_step_done(0, {"Y": output("Y", [1, 5], "a")}, lease("a"))
    assert run.ready_steps() == []
    assert run.result() == Error(
        ErrorCode.INVALID_ARG, "in ensemble 'e', step 1 (model 'b'): unexpected shape for input "
        "'X' for model 'b'. Expected [-1,4], got [1,5]")
    assert run.releasable_leases() == [lease("a")]


def test_missing_step_output_fails_its_consumer() -> None:
    run = docs_run()
    run.ready_steps()
    run.on_step_done(0, {}, lease("pre"))
    assert run.ready_steps() == []
    assert run.result() == Error(
        ErrorCode.INVALID_ARG, "in ensemble 'e', step 1 (model 'classify'): input "
        "'FORMATTED_IMAGE' has no data: step 0 (model 'preprocess') did not return output "
        "'PREPROCESSED_OUTPUT'")


def test_request_with_an_unknown_input_fails_at_once() -> None:
    run = EnsembleRun(docs_plan(), {"IMAGE": IMAGE, "EXTRA": IMAGE})
    assert run.finished() and run.ready_steps() == []
    assert run.result() == Error(
        ErrorCode.INVALID_ARG, "in ensemble 'e', unexpected input 'EXTRA' in request header "
        "that does not map to any ensemble inputs")


def test_optional_ensemble_input_not_given_is_left_out_of_the_step() -> None:
    a = model("a", io("X", "TYPE_FP32", [4]) + ", "
              + io("HINT", "TYPE_FP32", [4], "optional: true"), io("Y", "TYPE_FP32", [4]))
    config = ensemble("e", io("IN", "TYPE_FP32", [4]) + ", "
                      + io("HINT", "TYPE_FP32", [4], "optional: true"),
                      io("OUT", "TYPE_FP32", [4]),
                      [step("a", {"X": "IN", "HINT": "HINT"}, {"Y": "OUT"})])
    run = EnsembleRun(validate_ensemble(config, {"a": a}), {"IN": ref("IN", "FP32", [1, 4])})
    (call,) = run.ready_steps()
    assert list(call.inputs) == ["X"]


def test_step_done_for_a_step_not_in_flight_is_a_caller_error() -> None:
    run = docs_run()
    with pytest.raises(ValueError):
        run.on_step_done(0, {})
    with pytest.raises(RuntimeError):
        run.result()


# ------------------------------------------------------------------ memory


def test_intermediate_is_held_until_every_consumer_is_done() -> None:
    run = docs_run()
    run_preprocess(run)
    assert run.held_refs() == [PREPROCESSED]
    run.ready_steps()
    run.on_step_done(1, {"CLASSIFICATION_OUTPUT": SCORES}, lease("cls"))
    assert run.releasable_refs() == []
    assert run.releasable_leases() == []
    assert PREPROCESSED in run.held_refs()  # segment still reads it
    run.on_step_done(2, {"SEGMENTATION_OUTPUT": MASK}, lease("seg"))
    assert run.releasable_refs() == [PREPROCESSED]
    assert run.releasable_leases() == [lease("pre")]
    assert run.releasable_refs() == [] and run.releasable_leases() == []  # each once
    assert run.held_refs() == []


def test_unneeded_step_output_is_releasable_at_once_but_its_lease_waits() -> None:
    two = model("a", io("X", "TYPE_FP32", [4]),
                io("Y", "TYPE_FP32", [4]) + ", " + io("W", "TYPE_FP32", [4]))
    b = model("b", io("X", "TYPE_FP32", [4]), io("Y", "TYPE_FP32", [4]))
    config = ensemble("e", io("IN", "TYPE_FP32", [4]),
                      io("OUT", "TYPE_FP32", [4]) + ", " + io("SIDE", "TYPE_FP32", [4]),
                      [step("a", {"X": "IN"}, {"Y": "mid", "W": "SIDE"}),
                       step("b", {"X": "mid"}, {"Y": "OUT"})])
    run = EnsembleRun(validate_ensemble(config, {"a": two, "b": b}),
                      {"IN": ref("IN", "FP32", [1, 4])},
                      requested_outputs=[RequestedOutput("OUT")])
    (call,) = run.ready_steps()
    assert [o.name for o in call.outputs] == ["Y"]  # SIDE is not asked for
    mid, side = output("Y", [1, 4], "a"), output("W", [1, 4], "a")
    run.on_step_done(0, {"Y": mid, "W": side}, lease("a"))
    assert run.releasable_refs() == [side]
    assert run.releasable_leases() == []  # mid shares the lease and is still needed
    run.ready_steps()
    run.on_step_done(1, {"Y": output("Y", [1, 4], "b")}, lease("b"))
    assert run.releasable_refs() == [mid]
    assert run.releasable_leases() == [lease("a")]
    assert run.result_leases() == [lease("b")]


# ------------------------------------------------------------------ batching across models


def test_non_batching_output_gets_a_batch_dim_for_a_batching_consumer() -> None:
    flat = model("a", io("X", "TYPE_FP32", [4]), io("Y", "TYPE_FP32", [4]), max_batch_size=0)
    batching = model("b", io("X", "TYPE_FP32", [4]), io("Y", "TYPE_FP32", [4]))
    config = ensemble("e", io("IN", "TYPE_FP32", [4]), io("OUT", "TYPE_FP32", [4]),
                      [step("a", {"X": "IN"}, {"Y": "mid"}), step("b", {"X": "mid"}, {"Y": "OUT"})],
                      max_batch_size=0)
    run = EnsembleRun(validate_ensemble(config, {"a": flat, "b": batching}),
                      {"IN": ref("IN", "FP32", [4])})
    (first,) = run.ready_steps()
    assert (first.inputs["X"].shape, first.batch_size) == ([4], 1)
    run.on_step_done(0, {"Y": output("Y", [4], "a")}, lease("a"))
    (second,) = run.ready_steps()
    assert (second.inputs["X"].shape, second.batch_size) == ([1, 4], 1)
    run.on_step_done(1, {"Y": output("Y", [1, 4], "b")}, lease("b"))
    result = run.result()
    assert isinstance(result, dict) and result["OUT"].shape == [4]  # back to the ensemble's


def test_batch_of_one_loses_its_batch_dim_for_a_non_batching_consumer() -> None:
    batching = model("a", io("X", "TYPE_FP32", [4]), io("Y", "TYPE_FP32", [4]))
    flat = model("b", io("X", "TYPE_FP32", [4]), io("Y", "TYPE_FP32", [4]), max_batch_size=0)
    config = ensemble("e", io("IN", "TYPE_FP32", [4]), io("OUT", "TYPE_FP32", [4]),
                      [step("a", {"X": "IN"}, {"Y": "mid"}), step("b", {"X": "mid"}, {"Y": "OUT"})],
                      max_batch_size=1)
    run = EnsembleRun(validate_ensemble(config, {"a": batching, "b": flat}),
                      {"IN": ref("IN", "FP32", [1, 4])}, batch_size=1)
    run.ready_steps()
    run.on_step_done(0, {"Y": output("Y", [1, 4], "a")}, lease("a"))
    (second,) = run.ready_steps()
    assert (second.inputs["X"].shape, second.batch_size) == ([4], 1)
    run.on_step_done(1, {"Y": output("Y", [4], "b")}, lease("b"))
    result = run.result()
    assert isinstance(result, dict) and result["OUT"].shape == [1, 4]


def test_step_request_carries_the_ensemble_request_settings() -> None:
    parent = InferRequest(request_id=7, model="e", version=-1, inputs=[IMAGE],
                          parameters={"p": 1}, client_request_id="client-7", batch_size=BATCH,
                          priority=2, timeout_us=500, correlation_id=9, flags=1)
    (call,) = docs_run().ready_steps()
    request = step_request(call, parent, request_id=100)
    assert (request.request_id, request.model, request.version) == (100, "preprocess", -1)
    assert [t.name for t in request.inputs] == ["RAW_IMAGE"]
    assert [o.name for o in request.outputs] == ["PREPROCESSED_OUTPUT"]
    assert (request.parameters, request.client_request_id, request.batch_size) == (
        {"p": 1}, "client-7", BATCH)
    assert (request.priority, request.timeout_us, request.correlation_id, request.flags) == (
        2, 500, 9, 1)


# ------------------------------------------------------------------ withdrawn calls


def test_withdrawn_call_ends_a_failed_run_and_releases_what_it_would_have_read() -> None:
    run = EnsembleRun(diamond_plan(), {"IMAGE": IMAGE}, batch_size=BATCH)
    run_preprocess(run)
    assert models(run.ready_steps()) == ["classify", "segment"]  # segment waits for a slot
    run.on_step_done(1, Error(ErrorCode.INTERNAL, "boom"))
    assert not run.finished() and run.held_refs() == [PREPROCESSED]
    run.withdraw(2)
    assert run.finished()
    assert run.result() == Error(ErrorCode.INTERNAL,
                                 "in ensemble 'd', step 1 (model 'classify'): boom")
    assert run.held_refs() == []
    assert run.releasable_leases() == [lease("pre")]


def test_withdraw_is_refused_while_the_run_can_succeed_or_for_a_step_not_in_flight() -> None:
    run = docs_run()
    run.ready_steps()
    with pytest.raises(ValueError, match="cannot be withdrawn"):
        run.withdraw(0)  # the run has not failed
    run.cancel(Error(ErrorCode.CANCELLED, "request cancelled"))
    with pytest.raises(ValueError, match="cannot be withdrawn"):
        run.withdraw(1)  # never handed out
    run.withdraw(0)
    assert run.finished()

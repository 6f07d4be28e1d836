"""Ragged batching, pure parts: batch_input tensors, ragged concatenation, scatter, padding."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.errors import ErrorCode, ShoalError
from shoal.workers.ragged import BATCH_INPUT_KINDS, RaggedConfig
from shoal.workers.ragged_tensors import (
    batch_input_array,
    crop_padded_output,
    flatten_ragged,
    pad_ragged,
    padded_shape,
    padding_mask,
    scatter_output,
    scatter_shapes,
)

# Three requests of a [-1, -1] input: batch 1 x 3, batch 1 x 4, batch 2 x 5 (10 elements).
SHAPES = [(1, 3), (1, 4), (2, 5)]


def parse(text: str) -> ModelConfig:
    return text_format.Parse(textwrap.dedent(text), ModelConfig())


@pytest.mark.parametrize(("kind", "datatype", "expected"), [
    ("BATCH_ELEMENT_COUNT", "INT32", np.array([3, 4, 10], np.int32)),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT", "FP32", np.array([3, 7, 17], np.float32)),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "INT32", np.array([0, 3, 7, 17], np.int32)),
    ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "FP32", np.zeros(10, np.float32)),
    ("BATCH_ITEM_SHAPE", "INT32", np.array([[3], [4], [5], [5]], np.int32)),
    ("BATCH_ITEM_SHAPE_FLATTEN", "FP32", np.array([3, 4, 5, 5], np.float32)),
])
def test_each_batch_input_kind_has_tritons_values_shape_and_type(
        kind: str, datatype: str, expected: np.ndarray) -> None:
    array = batch_input_array(kind, datatype, SHAPES)
    assert array.dtype == expected.dtype
    assert array.shape == expected.shape
    np.testing.assert_array_equal(array, expected)


def test_item_shape_repeats_each_request_shape_per_batch_item() -> None:
    # model_config.proto's example: a batch-2 input of shape [3, 1] and a batch-1 of [2, 2].
    shapes = [(2, 3, 1), (1, 2, 2)]
    item = batch_input_array("BATCH_ITEM_SHAPE", "INT32", shapes)
    np.testing.assert_array_equal(item, [[3, 1], [3, 1], [2, 2]])
    flat = batch_input_array("BATCH_ITEM_SHAPE_FLATTEN", "INT32", shapes)
    np.testing.assert_array_equal(flat, [3, 1, 3, 1, 2, 2])


def test_item_shape_of_a_batch_only_input_has_zero_columns() -> None:
    assert batch_input_array("BATCH_ITEM_SHAPE", "INT32", [(2,), (1,)]).shape == (3, 0)


def test_flatten_ragged_concatenates_elements_and_is_zero_copy_when_adjacent() -> None:
    whole = np.arange(17, dtype=np.float32)
    parts = [whole[0:3].reshape(1, 3), whole[3:7].reshape(1, 4), whole[7:17].reshape(2, 5)]
    joined = flatten_ragged(parts)
    np.testing.assert_array_equal(joined, whole)
    assert np.shares_memory(joined, whole)
    separate = [p.copy() for p in parts]
    copied = flatten_ragged(separate)
    np.testing.assert_array_equal(copied, whole)
    assert not any(np.shares_memory(copied, p) for p in separate)


def test_scatter_output_cuts_the_flat_output_by_each_source_shape() -> None:
    output = np.arange(17, dtype=np.float32) * 2
    pieces = scatter_output(output, (-1, -1), SHAPES)
    assert [p.shape for p in pieces] == SHAPES
    np.testing.assert_array_equal(pieces[1], [[6, 8, 10, 12]])
    np.testing.assert_array_equal(pieces[2], (np.arange(7, 17) * 2).reshape(2, 5))


def test_scatter_keeps_fixed_dims_of_the_output() -> None:
    assert scatter_shapes((-1, -1, 2), [(1, 3), (2, 1)]) == [(1, 3, 2), (2, 1, 2)]
    pieces = scatter_output(np.arange(10), (-1, -1, 2), [(1, 3), (2, 1)])
    np.testing.assert_array_equal(pieces[1], [[[6, 7]], [[8, 9]]])


def test_scatter_of_too_small_an_output_is_an_error() -> None:
    with pytest.raises(ShoalError) as info:
        scatter_output(np.zeros(16, np.float32), (-1, -1), SHAPES)
    assert info.value.code == ErrorCode.INTERNAL


def test_pad_ragged_pads_every_dim_to_the_batch_maximum_with_zeros() -> None:
    arrays = [np.array([[1, 2]]), np.array([[3, 4, 5, 6]]), np.array([[7, 8, 9], [10, 11, 12]])]
    shapes = [a.shape for a in arrays]
    assert padded_shape(shapes) == (4, 4)
    padded = pad_ragged(arrays)
    np.testing.assert_array_equal(padded, [[1, 2, 0, 0], [3, 4, 5, 6], [7, 8, 9, 0],
                                           [10, 11, 12, 0]])
    mask = padding_mask(shapes, "INT64")
    assert mask.dtype == np.int64
    np.testing.assert_array_equal(mask, [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0],
                                         [1, 1, 1, 0]])
    assert padding_mask(shapes, "BOOL").dtype == np.bool_


def test_pad_ragged_writes_into_the_given_buffer_and_pads_bytes_with_empty() -> None:
    out = np.full((2, 3), 99, dtype=np.int32)
    pad_ragged([np.array([[1]], np.int32), np.array([[2, 3, 4]], np.int32)], out=out)
    np.testing.assert_array_equal(out, [[1, 0, 0], [2, 3, 4]])
    words = [np.array([[b"a"]], dtype=object), np.array([[b"b", b"c"]], dtype=object)]
    assert pad_ragged(words).tolist() == [[b"a", b""], [b"b", b"c"]]


def test_pad_ragged_of_equal_shapes_is_a_plain_concatenation() -> None:
    arrays = [np.ones((1, 3)), np.zeros((2, 3))]
    np.testing.assert_array_equal(pad_ragged(arrays), np.concatenate(arrays))


def test_padding_needs_inputs_of_one_rank() -> None:
    with pytest.raises(ShoalError):
        padded_shape([(1, 2), (1, 2, 3)])


def test_crop_padded_output_splits_rows_and_removes_the_padding() -> None:
    output = np.arange(4 * 5 * 2).reshape(4, 5, 2)
    pieces = crop_padded_output(output, (-1, -1, 2), SHAPES, batched=True)
    assert [p.shape for p in pieces] == [(1, 3, 2), (1, 4, 2), (2, 5, 2)]
    np.testing.assert_array_equal(pieces[0], output[0:1, :3])
    np.testing.assert_array_equal(pieces[2], output[2:4, :5])
    with pytest.raises(ShoalError):
        crop_padded_output(np.zeros((4, 2, 2)), (-1, -1, 2), SHAPES, batched=True)


RAGGED_CONFIG = """
name: "m"
max_batch_size: 8
input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true },
        { name: "FIXED" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS"
                data_type: TYPE_INT32 source_input: "IDS" },
              { kind: BATCH_ITEM_SHAPE target_name: [ "SHAPE_A", "SHAPE_B" ]
                data_type: TYPE_FP32 source_input: "IDS" } ]
batch_output [ { target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "IDS" } ]
"""


def test_config_is_parsed_into_ragged_inputs_batch_inputs_and_scatter_outputs() -> None:
    ragged = RaggedConfig.from_model_config(parse(RAGGED_CONFIG), "m")
    assert ragged.active and ragged.ragged_inputs == {"IDS"}
    assert ragged.extra_input_names == ["OFFSETS", "SHAPE_A", "SHAPE_B"]
    assert ragged.scatter_outputs["OUT"].shape == (-1, -1, 4)
    extras = ragged.extra_inputs([{"IDS": (1, 2), "FIXED": (1, 2)},
                                  {"IDS": (1, 5), "FIXED": (1, 2)}])
    assert [(name, datatype) for name, datatype, _ in extras] == [
        ("OFFSETS", "INT32"), ("SHAPE_A", "FP32"), ("SHAPE_B", "FP32")]
    np.testing.assert_array_equal(extras[0][2], [0, 2, 7])
    np.testing.assert_array_equal(extras[2][2], [[2], [5]])


def test_padding_parameter_adds_a_mask_input_and_crops_scatter_outputs() -> None:
    config = parse(RAGGED_CONFIG + """
        parameters { key: "shoal_pad_ragged_inputs" value { string_value: "MASK" } }
        parameters { key: "shoal_pad_mask_data_type" value { string_value: "TYPE_BOOL" } }""")
    ragged = RaggedConfig.from_model_config(config, "m")
    assert ragged.padding is not None and ragged.padding.source == "IDS"
    assert ragged.extra_input_names[-1] == "MASK"
    name, datatype, mask = ragged.extra_inputs([{"IDS": (1, 1)}, {"IDS": (1, 2)}])[-1]
    assert (name, datatype) == ("MASK", "BOOL")
    np.testing.assert_array_equal(mask, [[True, False], [True, True]])
    pieces = ragged.split_output(ragged.scatter_outputs["OUT"], np.zeros((2, 2, 4)),
                                 [(1, 1), (1, 2)])
    assert [p.shape for p in pieces] == [(1, 1, 4), (1, 2, 4)]


def test_a_model_without_ragged_settings_is_inactive() -> None:
    config = parse('name: "m" input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]')
    ragged = RaggedConfig.from_model_config(config, "m")
    assert not ragged.active and ragged.extra_input_names == []


@pytest.mark.parametrize(("extra", "field"), [
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "FIXED" data_type: TYPE_INT32 '
     'source_input: "IDS" } ]', "batch_input[2].target_name"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT64 '
     'source_input: "IDS" } ]', "batch_input[2].data_type"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 '
     'source_input: "NOPE" } ]', "batch_input[2].source_input"),
    ('parameters { key: "shoal_pad_ragged_inputs" value { string_value: "MASK:FIXED" } }',
     "shoal_pad_ragged_inputs"),
    ('parameters { key: "shoal_pad_ragged_inputs" value { string_value: "OFFSETS" } }',
     "shoal_pad_ragged_inputs"),
    ('parameters { key: "shoal_pad_ragged_inputs" value { string_value: "MASK" } }\n'
     'parameters { key: "shoal_pad_mask_data_type" value { string_value: "TYPE_FP16" } }',
     "shoal_pad_mask_data_type"),
])
def test_bad_ragged_settings_are_refused_naming_the_field(extra: str, field: str) -> None:
    with pytest.raises(ShoalError) as info:
        RaggedConfig.from_model_config(parse(RAGGED_CONFIG + extra), "m")
    assert info.value.code == ErrorCode.INVALID_ARG
    assert field in info.value.message


def test_every_kind_is_known() -> None:
    for kind in BATCH_INPUT_KINDS:
        assert batch_input_array(kind, "INT32", SHAPES).dtype == np.int32
    with pytest.raises(ShoalError):
        batch_input_array("BATCH_SOMETHING", "INT32", SHAPES)

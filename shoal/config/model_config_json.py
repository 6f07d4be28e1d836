"""Triton model configuration as JSON: in, the form of the load API's ``config`` parameter and
of a backend's auto-complete (``config_from_json``); out, the ``/config`` document as Triton
core's ModelConfigToJson prints it (``config_to_json``).

Pure functions of Triton's protobuf (``tritonclient.grpc.model_config_pb2.ModelConfig``); a text
that is not a model configuration is INVALID_ARG. ``model_config`` re-exports both functions
(they are imported from it across the package).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.errors import invalid_arg


def config_from_json(text: str | bytes) -> ModelConfig:
    """The JSON form used by the load API ``config`` parameter and by backend auto-complete.
    Unknown fields are errors (as in Triton's JsonToModelConfig)."""
    config = ModelConfig()
    try:
        json_format.Parse(text, config, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError) as exc:
        raise invalid_arg(f"invalid model configuration JSON: {exc}") from None
    return config


def config_to_json(config: ModelConfig) -> dict[str, object]:
    """Triton's /config JSON (core ModelConfigToJson): snake_case names, every default printed,
    enums by name, fields in declaration order, and the int64 fields Triton fixes up as numbers.
    Like Triton, ``priority_queue_policy`` keys (JSON keys), ``state[].initial_state[].dims``,
    cuda ``graph_spec`` dims and ``secondary_devices[].device_id`` stay strings."""
    if config.ByteSize() == 0:
        return {}
    raw = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    doc = _in_declaration_order(raw, ModelConfig.DESCRIPTOR)
    _fix_int64_fields(doc)
    return doc


def _in_declaration_order(value: dict[str, Any], descriptor: Any) -> dict[str, Any]:
    ordered: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            value_type = message.fields_by_name["value"].message_type
            if value_type is not None:
                item = {k: _in_declaration_order(v, value_type) for k, v in item.items()}
        elif message is not None and field.is_repeated:
            item = [_in_declaration_order(v, message) for v in item]
        elif message is not None:
            item = _in_declaration_order(item, message)
        ordered[field.name] = item
    return ordered


def _to_int(obj: dict[str, Any], key: str) -> None:
    if key in obj:
        value = obj[key]
        obj[key] = [int(v) for v in value] if isinstance(value, list) else int(value)


def _fix_int64_fields(doc: dict[str, Any]) -> None:
    for io in [*doc.get("input", []), *doc.get("output", [])]:
        _to_int(io, "dims")
        if "reshape" in io:
            _to_int(io["reshape"], "shape")
    if "specific" in doc.get("version_policy", {}):
        _to_int(doc["version_policy"]["specific"], "versions")
    if "dynamic_batching" in doc:
        batching = doc["dynamic_batching"]
        for key in ("max_queue_delay_microseconds", "priority_levels", "default_priority_level"):
            _to_int(batching, key)
        policies = [batching.get("default_queue_policy", {}),
                    *batching.get("priority_queue_policy", {}).values()]
        for policy in policies:
            _to_int(policy, "default_timeout_microseconds")
    if "sequence_batching" in doc:
        sequence = doc["sequence_batching"]
        _to_int(sequence, "max_sequence_idle_microseconds")
        for strategy in ("oldest", "direct"):
            _to_int(sequence.get(strategy, {}), "max_queue_delay_microseconds")
        for state in sequence.get("state", []):
            _to_int(state, "dims")
    scheduling = doc.get("ensemble_scheduling", {})
    for step in scheduling.get("step", []):
        _to_int(step, "model_version")
    if scheduling.get("max_inflight_requests") == 0:
        # Triton 2.51's ModelConfig has no such field: print it only when it is set.
        del scheduling["max_inflight_requests"]
    for warmup in doc.get("model_warmup", []):
        for warmup_input in warmup.get("inputs", {}).values():
            _to_int(warmup_input, "dims")

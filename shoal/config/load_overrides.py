"""Triton load overrides (``POST /v2/repository/models/M/load``, gRPC RepositoryModelLoad):
checked in full before anything touches a disk.

A load may carry ``config`` (a JSON ModelConfig that replaces config.pbtxt wholly, Triton's rule)
and ``file:<path>`` entries (bytes) that, with ``config``, form a temporary model directory
(``shoal.broker.lifecycle.materialize``). Everything here is pure: a hostile request is refused
with INVALID_ARG and a message that names the field at fault, and nothing is created. The same
checks are run again where the files are written (defence in depth). Model names never reach a
shell anywhere in shoal; the checks below make them safe as one path component.

Leaf module (stdlib, protobuf, ``shoal.errors``): used by the frontend, the broker and workers.

What is refused:

- model names (``check_model_name``): empty or whitespace only, ``.``/``..``, containing ``/`` or
  ``\\``, NUL or other control characters (Unicode category Cc), leading or trailing whitespace,
  a leading ``.`` (hidden: the repository scanner skips those), not encodable as UTF-8 (lone
  surrogates), longer than 255 bytes in UTF-8 (one path component);
- ``file:`` keys: an empty path, absolute, ``.``/``..`` or empty components anywhere, a backslash,
  control characters, a component over 255 bytes, a path over 4096 bytes or 64 components, a
  first component that is neither a version directory (ASCII digits, no leading zero except
  ``"0"``, at most 2**63-1) nor one of the folders a config can name files in (``warmup/``,
  ``initial_state/``), a path with no file below that first component, a path that is both a
  file and the directory of another, a value that is not ``bytes``, more than 1,000 files;
  keys are refused rather than normalised, so two keys can never name one file;
- files without ``config`` (an empty ``config`` string counts as none), a ``config`` that is not
  a string;
- ``config`` (``parse_config_override``): not JSON, not a ModelConfig (unknown fields included),
  and in the parsed config: ``name`` set and different from the model name; ``backend`` and
  ``platform`` that are not plain identifiers (``[A-Za-z0-9_-]``); ``runtime``,
  ``default_model_filename`` and every ``cc_model_filenames`` value that is not a plain file
  name; ``output[].label_filename`` that is not a relative path inside the model directory;
  ``model_warmup[].inputs[].input_data_file`` (inside ``warmup/``) and
  ``sequence_batching.state[].initial_state[].data_file`` (inside ``initial_state/``) likewise;
  ``ensemble_scheduling.step[].model_name`` that is not a valid model name (it becomes a
  repository path when the ensemble loads); any ``model_repository_agents.agents`` and any
  ``model_operations.op_library_filename`` (both load code from outside the model directory);
  ``parameters['EXECUTION_ENV_PATH']`` (python backend environment archive) unless it is
  ``$$TRITON_MODEL_DIRECTORY/<relative path inside the model directory>``.

Left alone, after reading every string field of model_config.proto: tensor, group, control,
state and step names, ``host_policy``, ``model_namespace``, ``metric_tags``, accelerator names and
parameters and other ``parameters`` (backend key/values that name no file here).

Unknown parameter keys (neither ``config`` nor ``file:*``) are ignored, as in Triton.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.errors import invalid_arg

CONFIG_PARAMETER: Final = "config"
FILE_PARAMETER_PREFIX: Final = "file:"
MAX_OVERRIDE_FILES: Final = 1000
MAX_COMPONENT_BYTES: Final = 255  # NAME_MAX
MAX_PATH_BYTES: Final = 4096  # PATH_MAX
MAX_PATH_COMPONENTS: Final = 64  # keeps tree walks (rmtree included) far from recursion limits
MODEL_DIRECTORY_VARIABLE: Final = "$$TRITON_MODEL_DIRECTORY"
_EXECUTION_ENV_PATH: Final = "EXECUTION_ENV_PATH"
# Folders of a model directory that a config names files in (besides version directories).
_DATA_FOLDERS: Final = frozenset({"warmup", "initial_state"})
_MAX_VERSION: Final = 2**63 - 1
_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9_-]{1,255}")
_SHOWN_CHARS: Final = 80


@dataclass(frozen=True)
class LoadOverrides:
    """A checked load request. ``config_json``: "" = no override. ``files``: relative path
    (``"1/model.pt"``, already checked, never normalised) -> content; empty unless
    ``config_json`` is set."""

    config_json: str
    files: dict[str, bytes]


class _Refusal(Exception):
    """(field, problem) raised by the config checks; turned into INVALID_ARG by the caller."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field = field
        self.problem = problem


def shown(text: str, limit: int = _SHOWN_CHARS) -> str:
    """``text`` made safe for an error message or a log line: non-printable characters escaped
    (no forged log lines), cut at ``limit`` characters."""
    safe = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text[:limit])
    return safe + ("..." if len(text) > limit else "")


def _has_control(text: str) -> bool:
    # Cc = C0 controls (NUL, tab, newline...), DEL and C1 controls
    return any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in text)


def _utf8_size(text: str) -> int | None:
    """Bytes in UTF-8; None when ``text`` cannot be encoded (lone surrogates)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


# ------------------------------------------------------------------ model names


def _model_name_problem(name: str) -> str | None:
    if not name.strip():
        return "must not be empty"
    if name in (".", ".."):
        return "must not be '.' or '..'"
    if "/" in name or "\\" in name:
        return "must not contain path separators ('/' or '\\')"
    if _has_control(name):
        return "must not contain NUL or other control characters"
    if name != name.strip():
        return "must not begin or end with whitespace"
    if name.startswith("."):
        return "must not begin with '.' (hidden directories are not models)"
    size = _utf8_size(name)
    if size is None:
        return "must be valid Unicode text"
    if size > MAX_COMPONENT_BYTES:
        return f"is longer than {MAX_COMPONENT_BYTES} bytes in UTF-8 ({size})"
    return None


def check_model_name(name: str) -> None:
    """Refuse a name that cannot be one directory of a model repository (see module doc)."""
    if not isinstance(name, str):
        raise invalid_arg("model name: must be a string")
    problem = _model_name_problem(name)
    if problem is not None:
        raise invalid_arg(f"model name '{shown(name)}': {problem}")


def check_model_directory(repository: str, name: str) -> str:
    """``<repository>/<name>`` for a load from the repository (no overrides), after checking the
    name. A model directory that is a symbolic link must resolve to a directory strictly inside
    the resolved repository; links that stay inside are fine. The directory need not exist (the
    caller reports a missing model)."""
    check_model_name(name)
    model_dir = os.path.join(repository, name)
    if os.path.islink(model_dir):
        root = os.path.realpath(repository)
        target = os.path.realpath(model_dir)
        if target == root or os.path.commonpath([root, target]) != root:
            raise invalid_arg(f"model '{shown(name)}': its directory is a symbolic link that "
                              "leads outside the model repository")
    return model_dir


# ------------------------------------------------------------------ paths


def relative_path_problem(path: str) -> str | None:
    """Why ``path`` is not a plain relative path that stays inside the directory it is joined
    to (None when it is). Refused rather than normalised: '.', '..' and empty components,
    backslashes, control characters, absolute paths, oversized components or paths."""
    if not path:
        return "the path is empty"
    if _has_control(path):
        return "the path contains NUL or other control characters"
    if "\\" in path:
        return "the path contains a backslash"
    if path.startswith("/"):
        return "the path is absolute"
    size = _utf8_size(path)
    if size is None:
        return "the path is not valid Unicode text"
    if size > MAX_PATH_BYTES:
        return f"the path is longer than {MAX_PATH_BYTES} bytes"
    parts = path.split("/")
    if len(parts) > MAX_PATH_COMPONENTS:
        return f"the path has more than {MAX_PATH_COMPONENTS} components"
    for part in parts:
        if part in (".", ".."):
            return "the path must not contain '.' or '..' components"
        if not part:
            return "the path has an empty component ('//' or a trailing '/')"
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            return f"a path component is longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def _file_name_problem(name: str) -> str | None:
    problem = relative_path_problem(name)
    if problem is None and "/" in name:
        return "must be a plain file name, not a path"
    return problem


def _is_version_directory(part: str) -> bool:
    """Triton's rule: an integral number, no leading zeros ("0" itself is version 0)."""
    if not (part.isascii() and part.isdigit()) or (len(part) > 1 and part.startswith("0")):
        return False
    return int(part) <= _MAX_VERSION


def override_file_problem(path: str) -> str | None:
    """Why ``path`` (a ``file:`` key without its prefix) is not acceptable (None when it is)."""
    problem = relative_path_problem(path)
    if problem is not None:
        return problem
    top, _, rest = path.partition("/")
    if not (_is_version_directory(top) or top in _DATA_FOLDERS):
        return ("must be '<version>/<file>' (version: a number without leading zeros), or a file "
                "under 'warmup/' or 'initial_state/'")
    if not rest:
        return f"must name a file inside '{top}/', not the directory itself"
    return None


def _directory_conflict(paths: Iterable[str]) -> str | None:
    """A path given as a file that is also the directory of another path, if any."""
    files = set(paths)
    for path in sorted(files):
        parts = path.split("/")
        for end in range(1, len(parts)):
            prefix = "/".join(parts[:end])
            if prefix in files:
                return prefix
    return None


# ------------------------------------------------------------------ load parameters


def check_load_parameters(name: str, parameters: Mapping[str, str | bytes]) -> LoadOverrides:
    """The overrides of one load request, fully checked (name, every ``file:`` key and value,
    the config). Raises INVALID_ARG naming the field; touches nothing on disk."""
    check_model_name(name)
    config = parameters.get(CONFIG_PARAMETER, "")
    if not isinstance(config, str):
        raise invalid_arg(f"failed to load '{shown(name)}': parameter '{CONFIG_PARAMETER}': "
                          "must be a string (a JSON model configuration)")
    keys = [key for key in parameters if key.startswith(FILE_PARAMETER_PREFIX)]
    if len(keys) > MAX_OVERRIDE_FILES:
        raise invalid_arg(f"failed to load '{shown(name)}': parameters: {len(keys)} "
                          f"'{FILE_PARAMETER_PREFIX}' parameters, at most "
                          f"{MAX_OVERRIDE_FILES} are allowed")
    files: dict[str, bytes] = {}
    for key in keys:
        value = parameters[key]
        if not isinstance(value, bytes):
            raise invalid_arg(f"failed to load '{shown(name)}': parameter '{shown(key)}': "
                              "must be bytes (the file's content)")
        files[key[len(FILE_PARAMETER_PREFIX):]] = value
    overrides = LoadOverrides(config_json=config, files=files)
    check_overrides(name, overrides)
    return overrides


def check_overrides(name: str, overrides: LoadOverrides) -> ModelConfig | None:
    """All the checks of ``check_load_parameters`` on an already built ``LoadOverrides`` (run
    again by whoever writes them to disk); the parsed config, None when there is no override."""
    check_model_name(name)
    if len(overrides.files) > MAX_OVERRIDE_FILES:
        raise invalid_arg(f"failed to load '{shown(name)}': parameters: at most "
                          f"{MAX_OVERRIDE_FILES} '{FILE_PARAMETER_PREFIX}' parameters are allowed")
    for path, data in overrides.files.items():
        problem = override_file_problem(path)
        if problem is None and not isinstance(data, bytes):
            problem = "must be bytes (the file's content)"
        if problem is not None:
            raise invalid_arg(f"failed to load '{shown(name)}': parameter "
                              f"'{FILE_PARAMETER_PREFIX}{shown(path)}': {problem}")
    conflict = _directory_conflict(overrides.files)
    if conflict is not None:
        raise invalid_arg(f"failed to load '{shown(name)}': parameter "
                          f"'{FILE_PARAMETER_PREFIX}{shown(conflict)}': is a file and also the "
                          "directory of another 'file:' parameter")
    if not overrides.config_json:
        if overrides.files:
            raise invalid_arg(f"failed to load '{shown(name)}': parameter '{CONFIG_PARAMETER}' "
                              "must be provided with file override ('file:' parameters): a "
                              "model made of override files has no other configuration")
        return None
    return parse_config_override(name, overrides.config_json)


# ------------------------------------------------------------------ the config override


def parse_config_override(name: str, config_json: str) -> ModelConfig:
    """The ``config`` parameter parsed (unknown fields refused, as in Triton) and checked (see
    module doc); ``name`` is filled in when unset. Errors: ``"failed to load 'M': config: ..."``."""
    config = ModelConfig()
    try:
        doc = json.loads(config_json, object_pairs_hook=_unique_keys)
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON object is expected, not {type(doc).__name__}")
        _check_unicode(doc)
        json_format.ParseDict(doc, config, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        problem = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise invalid_arg(f"failed to load '{shown(name)}': {CONFIG_PARAMETER}: not a valid "
                          f"JSON model configuration: {shown(problem, 200)}") from None
    if not config.name:
        config.name = name
    try:
        _check_config(config, name)
    except _Refusal as refusal:
        raise invalid_arg(f"failed to load '{shown(name)}': {CONFIG_PARAMETER}: "
                          f"{refusal.field}: {refusal.problem}") from None
    return config


def _check_unicode(doc: object) -> None:
    """Every string of ``doc`` has a UTF-8 form: a lone UTF-16 surrogate escape (``"\\ud800"``)
    decodes to a string protobuf cannot take (ParseDict failed with SystemError)."""
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff)") \
            from None


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    doc: dict[str, object] = {}
    for key, value in pairs:
        if key in doc:
            raise ValueError(f"duplicate key '{shown(key)}'")
        doc[key] = value
    return doc


def _refuse_if(problem: str | None, field: str) -> None:
    if problem is not None:
        raise _Refusal(field, problem)


def _check_config(config: ModelConfig, name: str) -> None:
    if config.name != name:
        raise _Refusal("name", f"'{shown(config.name)}' does not match the model name "
                       f"'{shown(name)}'")
    for field in ("backend", "platform"):
        value = str(getattr(config, field))
        if value and not _IDENTIFIER.fullmatch(value):
            raise _Refusal(field, f"'{shown(value)}' is not a plain name (letters, digits, "
                           "'_' and '-')")
    for field in ("runtime", "default_model_filename"):
        value = str(getattr(config, field))
        if value:
            _refuse_if(_file_name_problem(value), field)
    for key, value in sorted(config.cc_model_filenames.items()):
        _refuse_if(_file_name_problem(value), f"cc_model_filenames['{shown(key)}']")
    for i, output in enumerate(config.output):
        if output.label_filename:
            _refuse_if(relative_path_problem(output.label_filename), f"output[{i}].label_filename")
    _check_data_files(config)
    for i, step in enumerate(config.ensemble_scheduling.step):
        if step.model_name:
            _refuse_if(_model_name_problem(step.model_name),
                       f"ensemble_scheduling.step[{i}].model_name")
    if len(config.model_repository_agents.agents):
        raise _Refusal("model_repository_agents", "repository agents run code on the model's "
                       "files and cannot be set through the load API")
    if len(config.model_operations.op_library_filename):
        raise _Refusal("model_operations.op_library_filename", "custom operation libraries are "
                       "loaded from outside the model directory and cannot be set through the "
                       "load API")
    _check_execution_env(config)


def _check_data_files(config: ModelConfig) -> None:
    """Warmup inputs (``<model>/warmup/<file>``) and initial sequence states
    (``<model>/initial_state/<file>``) must stay inside their folders."""
    for i, warmup in enumerate(config.model_warmup):
        for input_name, warmup_input in sorted(warmup.inputs.items()):
            if warmup_input.WhichOneof("input_data_type") == "input_data_file":
                _refuse_if(relative_path_problem(warmup_input.input_data_file),
                           f"model_warmup[{i}].inputs['{shown(input_name)}'].input_data_file")
    for i, state in enumerate(config.sequence_batching.state):
        for j, initial in enumerate(state.initial_state):
            if initial.WhichOneof("state_data") == "data_file":
                _refuse_if(relative_path_problem(initial.data_file),
                           f"sequence_batching.state[{i}].initial_state[{j}].data_file")


def _check_execution_env(config: ModelConfig) -> None:
    if _EXECUTION_ENV_PATH not in config.parameters:
        return
    value = str(config.parameters[_EXECUTION_ENV_PATH].string_value)
    prefix = f"{MODEL_DIRECTORY_VARIABLE}/"
    problem = (relative_path_problem(value.removeprefix(prefix)) if value.startswith(prefix)
               else f"must be '{prefix}<path inside the model directory>'")
    _refuse_if(problem, f"parameters['{_EXECUTION_ENV_PATH}']")

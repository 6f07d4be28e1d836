"""The ``tensorflow`` backend class (see the package docstring and ``shoal/workers/backends/
base.py`` for the contract).

Load: ``<version_dir>/<default_model_filename or model.savedmodel>``, a SavedModel directory.
The signature Triton would serve is read and the config checked against it
(``signature.py``, ``config_check.py``); then TensorFlow's thread pools are sized
(``params.thread_counts``; they are per process, and a worker holds one instance) and the
SavedModel is loaded with ``tf.saved_model.load`` under the graph tag; the signature's
function is what runs. A ``tensorflow_graphdef`` model (``model.graphdef``, a file) is checked
and run by ``graphdef.py`` instead.

Execute: with ``max_batch_size > 0`` the requests of a batch run as one call (each input joined
along dim 0, zero-copy when the slices are adjacent in shared memory, then handed to
TensorFlow) and every output is split back by each request's batch size; with
``max_batch_size == 0`` each request runs alone. Inputs are fed by their signature key
(``reshape`` applied); BYTES tensors are ``tf.string`` both ways (object arrays of bytes).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

import numpy.typing as npt

from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.messages import Error
from shoal.workers.backends.base import (
    BackendRequest,
    BackendResponse,
    InstanceContext,
    OutputTensor,
)
from shoal.workers.backends.grouped_execute import execute_grouped, last_line
from shoal.workers.backends.sequence_controls import control_inputs
from shoal.workers.backends.tensorflow.autocomplete import DEFAULT_MODEL_FILENAME
from shoal.workers.backends.tensorflow.config_check import check_config
from shoal.workers.backends.tensorflow.graphdef import Run, load_graphdef
from shoal.workers.backends.tensorflow.params import tf_parameters, thread_counts
from shoal.workers.backends.tensorflow.runtime import import_tensorflow
from shoal.workers.backends.tensorflow.signature import read_signature
from shoal.workers.backends.torchscript_io import IoSpec, io_spec, reshape_output
from shoal.workers.batch_assembly import concat_rows, split_rows

logger = logging.getLogger(__name__)

Array = npt.NDArray[Any]
GRAPHDEF_PLATFORM: Final = "tensorflow_graphdef"
GRAPHDEF_FILENAME: Final = "model.graphdef"


class TensorflowBackend:
    def __init__(self) -> None:
        self._name = ""
        self._max_batch = 0
        self._inputs: list[IoSpec] = []  # config inputs, then sequence controls (no reshape)
        self._outputs: list[IoSpec] = []
        self._tf: Any = None
        self._loaded: Any = None  # keeps the SavedModel's variables alive
        self._function: Run | None = None  # {input: tensor} -> {output: tensor}
        self._device = "/CPU:0"

    # ------------------------------------------------------------------ load

    def load(self, ctx: InstanceContext) -> None:
        config = ctx.config
        model = ctx.model_name
        if len(config.batch_input) or (config.HasField("sequence_batching")
                                       and len(config.sequence_batching.state)):
            raise ShoalError(ErrorCode.UNSUPPORTED,
                             f"model '{model}': batch_input and implicit sequence state are not "
                             "supported by the tensorflow backend")
        self._name = ctx.instance_name
        self._max_batch = int(config.max_batch_size)
        params = tf_parameters(config)
        graphdef = config.platform == GRAPHDEF_PLATFORM
        filename = config.default_model_filename or (
            GRAPHDEF_FILENAME if graphdef else DEFAULT_MODEL_FILENAME)
        path = os.path.join(ctx.version_dir, filename)
        shown = f"{model}/{ctx.model_version}/{filename}"
        if not (os.path.isfile(path) if graphdef else os.path.isdir(path)):
            kind = ("a GraphDef file" if graphdef
                    else "a SavedModel directory (saved_model.pb and variables/)")
            raise invalid_arg(f"unable to find '{shown}' for model instance '{self._name}': "
                              f"{kind}")
        # the sequence control inputs are fed like config inputs (checked against the model)
        controls = control_inputs(config)
        self._inputs = [io_spec(io) for io in config.input] + controls
        self._outputs = [io_spec(io) for io in config.output]
        signature = None
        if not graphdef:
            signature = read_signature(path, model, params.graph_tag, params.signature_def)
            check_config(model, config, signature, controls)

        tf = self._tf = import_tensorflow()
        intra, inter = thread_counts(params, config, ctx.backend_settings,
                                     ctx.default_intra_op_threads)
        _size_thread_pools(tf, intra, inter)
        self._device = self._device_for(tf, ctx)
        with tf.device(self._device):
            if signature is None:
                self._function = load_graphdef(tf, path, shown, model, config, controls)
            else:
                self._function = self._load_savedmodel(tf, path, shown, model, params.graph_tag,
                                                       signature.key)
        logger.info("tensorflow instance '%s': %s on %s, %d intra-op / %d inter-op thread(s)",
                    self._name, "GraphDef" if signature is None else
                    f"signature '{signature.key}'", self._device, intra, inter)

    def _load_savedmodel(self, tf: Any, path: str, shown: str, model: str, tag: str,
                         key: str) -> Run:
        try:
            self._loaded = tf.saved_model.load(path, tags=[tag])
            function = self._loaded.signatures[key]
        except Exception as exc:
            raise invalid_arg(f"unable to load model '{model}': cannot load SavedModel "
                              f"'{os.path.basename(path)}': "
                              f"{last_line(exc).replace(path, shown)}") from None

        def run(feeds: dict[str, Any]) -> dict[str, Any]:
            return dict(function(**feeds))

        return run

    @staticmethod
    def _device_for(tf: Any, ctx: InstanceContext) -> str:
        if ctx.kind != "GPU":
            return "/CPU:0"
        if not tf.config.list_physical_devices("GPU"):
            raise ShoalError(ErrorCode.UNSUPPORTED,
                             f"model '{ctx.model_name}': a KIND_GPU instance needs a TensorFlow "
                             "build that sees a GPU (the installed one sees none; "
                             "tensorflow-cpu never does)")
        return f"/GPU:{ctx.device_id}"

    # ------------------------------------------------------------------ execute

    def execute(self, requests: list[BackendRequest]) -> list[BackendResponse | Error | None]:
        assert self._function is not None, "execute() before load()"
        return execute_grouped(requests, batched=self._max_batch > 0,
                               input_names=[spec.name for spec in self._inputs], run=self._run,
                               runtime="tensorflow", instance=self._name, log=logger)

    def unload(self) -> None:
        self._function = None
        self._loaded = None

    def _run(self, batch: list[BackendRequest]) -> list[BackendResponse | Error]:
        assert self._function is not None
        tf = self._tf
        batched = self._max_batch > 0
        sizes = [request.batch_size for request in batch]
        total = sum(sizes)
        if batched and total > self._max_batch:
            raise ShoalError(ErrorCode.INTERNAL, f"batch size {total} for '{self._name}', max "
                                                 f"allowed is {self._max_batch}")
        feeds: dict[str, Any] = {}
        for spec in self._inputs:
            arrays = [request.inputs[spec.name] for request in batch]
            joined = concat_rows(arrays) if batched else arrays[0]
            if spec.reshape is not None:
                joined = joined.reshape(((total,) if batched else ()) + spec.reshape)
            feeds[spec.name] = tf.constant(joined, dtype=tf.string if spec.datatype == "BYTES"
                                           else None)
        with tf.device(self._device):
            produced = self._function(feeds)
        pieces: dict[str, list[Array]] = {}
        for spec in self._outputs:
            array = produced[spec.name].numpy()
            pieces[spec.name] = self._split(spec, array, sizes)
        return [BackendResponse(outputs=[OutputTensor(spec.name, spec.datatype,
                                                      pieces[spec.name][k])
                                         for spec in self._outputs])
                for k in range(len(batch))]

    def _split(self, spec: IoSpec, array: Array, sizes: list[int]) -> list[Array]:
        if self._max_batch == 0:
            return [reshape_output(spec, array, ())]
        if array.ndim == 0 or array.shape[0] != sum(sizes):
            raise ShoalError(ErrorCode.INTERNAL,
                             f"output '{spec.name}' has shape {list(array.shape)}, expected "
                             f"batch dimension {sum(sizes)}")
        return [reshape_output(spec, part, (size,))
                for part, size in zip(split_rows(array, sizes), sizes, strict=True)]


def _size_thread_pools(tf: Any, intra: int, inter: int) -> None:
    """Set TensorFlow's per-process pools; possible only before its runtime starts, which in a
    worker (one instance per process) it has not. A process that already runs TensorFlow
    (a backend loaded in a test process) keeps its pools, and says so."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        logger.warning("TensorFlow already runs in this process: its thread pools stay as they "
                       "are (%d intra-op / %d inter-op thread(s) not applied)", intra, inter)



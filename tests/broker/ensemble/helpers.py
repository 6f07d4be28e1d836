"""Hand-built ensembles for the ensemble tests.

``DOCS_*`` is the shape of Triton's documented example (ensemble_models.md): a preprocessing
model whose one output feeds both a classification and a segmentation model. ``DIAMOND_*`` adds
a join: two branches from one intermediate, merged by a fourth step.
"""

from __future__ import annotations

from collections.abc import Sequence

from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.broker.ensemble import EnsemblePlan, validate_ensemble
from shoal.config.model_config import normalize_config, parse_config_text
from shoal.dtypes import element_count, element_size
from shoal.messages import Lease, TensorRef


def config(name: str, text: str, *, normalize: bool = True) -> ModelConfig:
    source = f"{name}/config.pbtxt"
    parsed = parse_config_text(f'name: "{name}"\n{text}', source)
    return normalize_config(parsed, model_name=name, source=source) if normalize else parsed


def model(name: str, inputs: str, outputs: str, *, max_batch_size: int = 4,
          extra: str = "") -> ModelConfig:
    """A python-backend composing model; ``inputs``/``outputs``: pbtxt list bodies."""
    return config(name, f'backend: "python"\nmax_batch_size: {max_batch_size}\n'
                        f"input [ {inputs} ]\noutput [ {outputs} ]\n{extra}")


def io(name: str, data_type: str, dims: Sequence[int], extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {data_type} dims: {list(dims)} {extra} }}'


def step(model_name: str, inputs: dict[str, str], outputs: dict[str, str],
         version: int = -1) -> str:
    """One ``step`` entry; ``inputs``/``outputs``: model tensor -> ensemble tensor."""
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model_name}" model_version: {version}{maps} }}'


def ensemble(name: str, inputs: str, outputs: str, steps: Sequence[str], *,
             max_batch_size: int = 4, normalize: bool = True) -> ModelConfig:
    return config(name, f'platform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
                        f"input [ {inputs} ]\noutput [ {outputs} ]\n"
                        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}",
                  normalize=normalize)


IMAGE_DIMS = (3, 4, 4)
CLASSES = 10

DOCS_MODELS = {
    "preprocess": model("preprocess", io("RAW_IMAGE", "TYPE_STRING", [1]),
                        io("PREPROCESSED_OUTPUT", "TYPE_FP32", IMAGE_DIMS)),
    "classify": model("classify", io("FORMATTED_IMAGE", "TYPE_FP32", IMAGE_DIMS),
                      io("CLASSIFICATION_OUTPUT", "TYPE_FP32", [CLASSES])),
    "segment": model("segment", io("FORMATTED_IMAGE", "TYPE_FP32", IMAGE_DIMS),
                     io("SEGMENTATION_OUTPUT", "TYPE_FP32", IMAGE_DIMS)),
}

DOCS_STEPS = [
    step("preprocess", {"RAW_IMAGE": "IMAGE"}, {"PREPROCESSED_OUTPUT": "preprocessed_image"}),
    step("classify", {"FORMATTED_IMAGE": "preprocessed_image"},
         {"CLASSIFICATION_OUTPUT": "CLASSIFICATION"}),
    step("segment", {"FORMATTED_IMAGE": "preprocessed_image"},
         {"SEGMENTATION_OUTPUT": "SEGMENTATION"}),
]


def docs_ensemble(steps: Sequence[str] = DOCS_STEPS, *, normalize: bool = True) -> ModelConfig:
    return ensemble("e", io("IMAGE", "TYPE_STRING", [1]),
                    io("CLASSIFICATION", "TYPE_FP32", [CLASSES]) + ", "
                    + io("SEGMENTATION", "TYPE_FP32", IMAGE_DIMS), steps, normalize=normalize)


def docs_plan() -> EnsemblePlan:
    return validate_ensemble(docs_ensemble(), DOCS_MODELS)


DIAMOND_MODELS = {
    **DOCS_MODELS,
    "combine": model("combine", io("SCORES", "TYPE_FP32", [CLASSES]) + ", "
                     + io("MASK", "TYPE_FP32", IMAGE_DIMS),
                     io("SUMMARY", "TYPE_FP32", [CLASSES])),
}


def diamond_plan() -> EnsemblePlan:
    steps = [*DOCS_STEPS[:1],
             step("classify", {"FORMATTED_IMAGE": "preprocessed_image"},
                  {"CLASSIFICATION_OUTPUT": "scores"}),
             step("segment", {"FORMATTED_IMAGE": "preprocessed_image"},
                  {"SEGMENTATION_OUTPUT": "mask"}),
             step("combine", {"SCORES": "scores", "MASK": "mask"}, {"SUMMARY": "SUMMARY"})]
    config = ensemble("d", io("IMAGE", "TYPE_STRING", [1]),
                      io("SUMMARY", "TYPE_FP32", [CLASSES]), steps)
    return validate_ensemble(config, DIAMOND_MODELS)


def ref(name: str, datatype: str, shape: Sequence[int], region: str = "/shoal-test-fe",
        offset: int = 0, nbytes: int | None = None) -> TensorRef:
    """A tensor descriptor; ``nbytes`` defaults to what the shape needs (16 for BYTES)."""
    if nbytes is None:
        nbytes = 16 if datatype == "BYTES" else element_count(shape) * element_size(datatype)
    return TensorRef(name, datatype, list(shape), region, offset, nbytes)


def output(name: str, shape: Sequence[int], worker: str, datatype: str = "FP32") -> TensorRef:
    """A composing model's output in worker ``worker``'s arena."""
    return ref(name, datatype, shape, region=f"/shoal-test-{worker}")


def lease(worker: str, lease_id: int = 1) -> Lease:
    return Lease(worker, lease_id)

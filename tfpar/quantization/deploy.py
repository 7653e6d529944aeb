"""The deployment report of ``export_tflite(..., compress=True)``, and its accuracy gate.

What a compressed model is worth where it runs: the TFLite file's size, raw and gzip-compressed
(what a download or a firmware image carries); its sparsity and the distinct values of each
weight tensor (what pruning and clustering left, read from the file itself); its accuracy in the
TFLite interpreter against the float model's own TFLite file on held-out data; and the latency of
both, batch 1, in the interpreter this process runs (TensorFlow's, with its default XNNPACK
delegate for float and int8 kernels).
"""

import dataclasses
import gzip
import pathlib
import statistics
import time
from typing import Any

import numpy as np

__all__ = [
    "AccuracyDropError",
    "DeploymentReport",
    "WeightTensor",
    "latencies_in_turns",
    "latency_seconds",
    "measure",
    "weight_tensors",
]


class AccuracyDropError(ValueError):
    """`export_tflite` refused to write: the accuracy drop exceeds ``max_accuracy_drop``.
    ``report`` holds the figures."""

    def __init__(self, message: str, report: "DeploymentReport") -> None:
        super().__init__(message)
        self.report = report


@dataclasses.dataclass(frozen=True)
class WeightTensor:
    """A constant weight tensor of the TFLite file (a kernel: two dimensions or more)."""

    name: str
    shape: tuple
    dtype: str
    sparsity: float
    """Fraction of its values equal to zero (the quantized zero point for int8)."""
    unique: int
    """Distinct values it holds."""


@dataclasses.dataclass(frozen=True)
class DeploymentReport:
    """Figures of a TFLite file against the float model's, measured in this process."""

    size_bytes: int
    gzip_bytes: int
    reference_size_bytes: int
    reference_gzip_bytes: int
    sparsity: float
    """Zeros over all the weight tensors' values."""
    weights: tuple
    """A `WeightTensor` per kernel, in the file's order."""
    accuracy: float
    reference_accuracy: float
    examples: int
    """Held-out examples the accuracies are measured on."""
    latency_seconds: float
    reference_latency_seconds: float
    """Median of one batch-1 invocation, the two files measured in turns."""
    max_accuracy_drop: float | None = None

    @property
    def accuracy_drop(self):
        return self.reference_accuracy - self.accuracy

    @property
    def gzip_ratio(self):
        """The float file gzipped ÷ this one gzipped: what deployment saves."""
        return self.reference_gzip_bytes / self.gzip_bytes

    @property
    def speedup(self):
        return self.reference_latency_seconds / self.latency_seconds

    def describe(self) -> str:
        gate = (
            ""
            if self.max_accuracy_drop is None
            else f" (max_accuracy_drop {self.max_accuracy_drop:g})"
        )
        lines = [
            f"size:      {self.size_bytes:,} bytes, {self.gzip_bytes:,} gzipped; float "
            f"{self.reference_size_bytes:,}, {self.reference_gzip_bytes:,} gzipped: "
            f"{self.gzip_ratio:.2f}x smaller gzipped",
            f"accuracy:  {self.accuracy:.4f} in the TFLite interpreter, float "
            f"{self.reference_accuracy:.4f} on {self.examples} held-out examples: drop "
            f"{self.accuracy_drop:+.4f}{gate}",
            f"latency:   {self.latency_seconds * 1e6:.1f} us per example (batch 1), float "
            f"{self.reference_latency_seconds * 1e6:.1f} us: {self.speedup:.2f}x faster",
            f"sparsity:  {self.sparsity:.1%} of the weights are zero",
            *(
                f"  {w.name} {w.dtype}{list(w.shape)}: {w.unique} distinct values, "
                f"{w.sparsity:.1%} zero"
                for w in self.weights
            ),
        ]
        return "\n".join(lines)


def measure(
    export: Any,
    reference_export: Any,
    validation_data: Any,
    max_accuracy_drop: float | None,
    latency_repeats: int = 300,
) -> "DeploymentReport":
    """The `DeploymentReport` of ``export`` (a `TFLiteExport`) against ``reference_export``."""
    x, y = validation_data
    accuracy = {"model": export.accuracy(x, y), "reference": reference_export.accuracy(x, y)}
    latency = latencies_in_turns(
        {"model": export, "reference": reference_export}, x[:1], latency_repeats
    )
    contents = {
        name: pathlib.Path(each.path).read_bytes()
        for name, each in (("model", export), ("reference", reference_export))
    }
    weights = weight_tensors(contents["model"])
    values = sum(int(np.prod(w.shape)) for w in weights)
    return DeploymentReport(
        size_bytes=len(contents["model"]),
        gzip_bytes=len(gzip.compress(contents["model"], 9)),
        reference_size_bytes=len(contents["reference"]),
        reference_gzip_bytes=len(gzip.compress(contents["reference"], 9)),
        sparsity=sum(w.sparsity * int(np.prod(w.shape)) for w in weights) / values
        if values
        else 0.0,
        weights=weights,
        accuracy=accuracy["model"],
        reference_accuracy=accuracy["reference"],
        examples=len(x),
        latency_seconds=latency["model"],
        reference_latency_seconds=latency["reference"],
        max_accuracy_drop=max_accuracy_drop,
    )


def weight_tensors(content: bytes) -> tuple["WeightTensor", ...]:
    """The kernels (constant tensors of two dimensions or more) of a TFLite flatbuffer."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    types = {
        schema.TensorType.FLOAT32: np.float32,
        schema.TensorType.FLOAT16: np.float16,
        schema.TensorType.INT8: np.int8,
        schema.TensorType.UINT8: np.uint8,
        schema.TensorType.INT32: np.int32,
    }
    names = {
        value: name for name, value in vars(schema.TensorType).items() if not name.startswith("_")
    }
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    found = []
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            data = model.buffers[tensor.buffer].data
            if (
                data is None
                or len(data) == 0
                or tensor.shape is None
                or len(tensor.shape) < 2
                or tensor.type not in types
            ):
                continue
            values = np.frombuffer(bytes(data), dtype=types[tensor.type])
            zero = 0
            if (
                tensor.quantization is not None
                and tensor.quantization.zeroPoint is not None
                and len(tensor.quantization.zeroPoint) == 1
            ):
                zero = int(tensor.quantization.zeroPoint[0])
            name = tensor.name.decode() if isinstance(tensor.name, bytes) else str(tensor.name)
            found.append(
                WeightTensor(
                    name=name.split(";")[0],
                    shape=tuple(int(d) for d in tensor.shape),
                    dtype=names[tensor.type].lower(),
                    sparsity=float(np.mean(values == zero)),
                    unique=int(np.unique(values).size),
                )
            )
    return tuple(found)


def latencies_in_turns(
    exports: dict, sample: Any, repeats: int, builtin_kernels: bool = False, rounds: int = 3
) -> dict[str, float]:
    """{name: median `latency_seconds`} of each `TFLiteExport` in ``exports`` ({name: export}),
    measured in turns over ``rounds`` rounds, so that a slow moment of the machine falls on all."""
    times: dict[str, list[float]] = {name: [] for name in exports}
    for _ in range(rounds):
        for name, export in exports.items():
            times[name].append(latency_seconds(export, sample, repeats, builtin_kernels))
    return {name: statistics.median(values) for name, values in times.items()}


def latency_seconds(export: Any, sample: Any, repeats: int, builtin_kernels: bool = False) -> float:
    """Median seconds of one batch-1 invocation of ``export`` (a `TFLiteExport`) on ``sample``.

    ``builtin_kernels``: TFLite's built-in kernels only, without the XNNPACK delegate the
    interpreter applies by default."""
    interpreter = export.interpreter(batch_size=1, builtin_kernels=builtin_kernels)
    detail = interpreter.get_input_details()[0]
    model_input = export.model_input(interpreter, sample)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        interpreter.set_tensor(detail["index"], model_input)
        interpreter.invoke()
        times.append(time.perf_counter() - start)
    return statistics.median(times)

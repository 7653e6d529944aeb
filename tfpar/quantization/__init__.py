"""Quantization-aware training, pruning, weight clustering and int8 TFLite export through
tensorflow-model-optimization.

See `tfpar.quantization.qat` (quantize), `tfpar.quantization.export` (export_tflite),
`tfpar.quantization.pruning` (prune) and `tfpar.quantization.clustering` (cluster).
"""

from tfpar.quantization.clustering import cluster, strip_clustering, unique_weights
from tfpar.quantization.deploy import AccuracyDropError
from tfpar.quantization.export import TFLiteExport, export_tflite
from tfpar.quantization.pruning import prune, sparsity, strip_pruning
from tfpar.quantization.qat import quantize, quantizer_ranges

__all__ = [
    "AccuracyDropError",
    "TFLiteExport",
    "cluster",
    "export_tflite",
    "prune",
    "quantize",
    "quantizer_ranges",
    "sparsity",
    "strip_clustering",
    "strip_pruning",
    "unique_weights",
]

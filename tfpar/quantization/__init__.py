"""Quantization-aware training, pruning and int8 TFLite export through tensorflow-model-optimization.

See `tfpar.quantization.qat` (quantize, export_tflite) and `tfpar.quantization.pruning` (prune).
"""

from tfpar.quantization.pruning import prune, sparsity, strip_pruning
from tfpar.quantization.qat import TFLiteExport, export_tflite, quantize, quantizer_ranges

__all__ = ["TFLiteExport", "export_tflite", "prune", "quantize", "quantizer_ranges", "sparsity", "strip_pruning"]

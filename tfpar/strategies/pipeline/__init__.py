"""The pipeline's former place, kept so that code written for it still imports.

The pipeline is not a strategy (it stages a model; it has no replicas of its own kind to
put variables on), so it lives in `tfpar.pipeline`. This package is an alias of it:
``tfpar.strategies.pipeline.Pipeline`` is ``tfpar.pipeline.Pipeline``, and the pure
``tfpar.strategies.pipeline.schedule`` is ``tfpar.pipeline.schedule`` (no TensorFlow).
"""

import sys

from tfpar.pipeline import __all__, __dir__, __getattr__  # noqa: F401 (the same lazy names)
from tfpar.pipeline import schedule

sys.modules[f"{__name__}.schedule"] = schedule

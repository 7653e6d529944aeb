"""Mixed precision: `use` a policy ("auto" picks one for the hardware) and check models.

See `tfpar.precision.policy`.
"""

from tfpar.precision.policy import (
    POLICIES,
    PrecisionWarning,
    check_output_precision,
    choose,
    current,
    loss_scale_of,
    use,
)

__all__ = [
    "POLICIES",
    "PrecisionWarning",
    "check_output_precision",
    "choose",
    "current",
    "loss_scale_of",
    "use",
]

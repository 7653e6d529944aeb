"""The gradient paths of the data-parallel strategies, and `verify`'s comparison of each with one
replica.

A *path* is what happens to the gradients between the backward pass and the update: sent as they are
("plain"), cast to 16 bits for the wire ("bf16", "fp16"), reduce-scattered to shard the optimizer
state ("zero1", "zero2"), accumulated over 2 steps ("accumulate"), or scaled by a mixed-precision
loss scale ("mixed_float16"), and each allowed pair of these. `PATHS` lists them all; ``tfpar verify
--paths all`` trains the user's model on each and prints one row per path.

Each path is compared with the user's Keras on one replica from the same weights and batches: an
accumulated path with one step of its 2 global batches (Keras 3's own accumulation and one step of
the larger batch agree, but for Keras 3's Adam on a sparse gradient, whose second moment then takes
the summed gradient: Keras 3 is then compared with its own ``gradient_accumulation_steps``), a mixed
path with the one replica under the same policy. A float32 path must end within ``tolerance`` of it.
A 16-bit path is held to the error of the whole update, in norm, relative to the update: at most
2^-5 for mixed_float16 alone (its loss scale keeps the gradients in float16's normal range), and at
most 1/4 with compression. Adam divides each element's step by that element's own size, so an
element whose gradient nearly cancels over the replicas, and which the cast then rounds, moves by a
good part of a step; on an Embedding most rows are such. Measured with Adam(1e-2), 4 steps, 2
replicas (tests/gradient_paths.py): bf16 0.002 on the text model and the image model, but 0.15 to
0.18 for bf16 with accumulation on the text model (its embedding's accumulated rows cast to bf16 and
summed in bf16); fp16 at most 0.013, mixed_float16 at most 0.013. A maximum over elements would not
be a fair measure.
"""

import dataclasses
import itertools

import numpy as np

__all__ = ["PATHS", "GradientPath", "PathRow", "PathsReport", "check_paths", "paths_from"]


@dataclasses.dataclass(frozen=True)
class GradientPath:
    """One path: the strategy options and the precision it trains with."""

    name: str
    compression: str = "none"
    zero_stage: int = 0
    accumulation: int = 1
    precision: str = "float32"

    @property
    def bound(self) -> float | None:
        """The largest relative error of the update a 16-bit path may show (None: float32, which
        is held to the absolute tolerance)."""
        if self.compression != "none":
            return 0.25
        if self.precision != "float32":
            return 2.0**-5
        return None

    def options(self) -> dict:
        """The `tfpar._factory.ParallelismSpec` fields of this path."""
        return {
            "compression": self.compression,
            "zero_stage": self.zero_stage,
            "gradient_accumulation_steps": self.accumulation,
        }


_SINGLES = (
    GradientPath("plain"),
    GradientPath("bf16", compression="bf16"),
    GradientPath("fp16", compression="fp16"),
    GradientPath("zero1", zero_stage=1),
    GradientPath("zero2", zero_stage=2),
    GradientPath("accumulate", accumulation=2),
    GradientPath("mixed_float16", precision="mixed_float16"),
)


def _pair(a, b):
    fields = {
        f.name: getattr(b, f.name) if getattr(b, f.name) != f.default else getattr(a, f.name)
        for f in dataclasses.fields(GradientPath)
        if f.name != "name"
    }
    return GradientPath(f"{a.name}+{b.name}", **fields)


def _kind(path):
    return next(
        f
        for f in ("compression", "zero_stage", "accumulation", "precision")
        if getattr(path, f) != getattr(GradientPath("plain"), f)
    )


PATHS = {path.name: path for path in _SINGLES}
"""Every path by name: the single ones, then each pair of two different kinds (a compression with a
ZeRO stage, accumulation, or mixed precision; a ZeRO stage with accumulation or mixed precision;
accumulation with mixed precision)."""
PATHS.update(
    {
        p.name: p
        for a, b in itertools.combinations(_SINGLES[1:], 2)
        if _kind(a) != _kind(b)
        for p in [_pair(a, b)]
    }
)


def paths_from(value) -> list:
    """``"all"``, a comma-separated string or a list of path names, as `GradientPath` objects.

    Raises:
        ValueError: a name that is not in `PATHS`, or none at all.
    """
    if value == "all":
        names = list(PATHS)
    else:
        given = value.split(",") if isinstance(value, str) else value
        names = [n.strip() for n in given if n.strip()]
    unknown = [n for n in names if n not in PATHS]
    if unknown or not names:
        raise ValueError(
            f"paths takes 'all' or names of {sorted(PATHS)}. Received: paths={value!r}. "
            "Use --paths all, or e.g. --paths plain,zero1,bf16+zero2."
        )
    return [PATHS[n] for n in names]


def check_paths(value, steps, zero_stage=0) -> list:
    """``value``'s paths (`paths_from`), checked against ``verify``'s other arguments, before any
    run.

    Raises:
        ValueError: a ``zero_stage`` beside them (each path sets its own), or ``steps`` that an
            accumulating path cannot compare (not a multiple of its accumulated steps).
    """
    paths = paths_from(value)
    if zero_stage:
        raise ValueError(
            "paths set the ZeRO stage of each path (zero1, zero2). Received: "
            f"zero_stage={zero_stage} with paths={value!r}. Drop --zero-stage, and name the zero1 "
            "or zero2 paths."
        )
    window = max(p.accumulation for p in paths)
    if steps % window:
        names = [p.name for p in paths if p.accumulation > 1]
        raise ValueError(
            f"paths {', '.join(names)} accumulate {window} steps per update, compared with one "
            f"step of {window} global batches, so steps must be a multiple of {window}. "
            f"Received: steps={steps}. Use steps={steps + window - steps % window}."
        )
    return paths


@dataclasses.dataclass(frozen=True)
class PathRow:
    """One path's outcome: ``verdict`` "ok", "DIFF" or "refused" (``detail`` says why)."""

    path: str
    verdict: str
    max_difference: float | None = None
    relative_error: float | None = None
    bound: str = ""
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class PathsReport:
    """`verify`'s rows for several paths; ``passed`` when none differs (a refusal is not a
    difference)."""

    description: str
    steps: int
    rows: tuple
    chief: bool = True

    @property
    def passed(self) -> bool:
        return all(row.verdict != "DIFF" for row in self.rows)

    def describe(self) -> str:
        width = max(len(row.path) for row in self.rows)
        lines = [
            self.description,
            f"each path after {self.steps} steps against one replica, from the same weights "
            "and batches (largest |difference| of a weight; relative error of the whole "
            "update):",
        ]
        for row in self.rows:
            if row.verdict == "refused":
                lines.append(f"  {row.path:<{width}}  refused  {row.detail}")
                continue
            lines.append(
                f"  {row.path:<{width}}  {row.verdict:<7}  "
                f"max |difference| {row.max_difference:.3g}  "
                f"update error {row.relative_error:.3g}  (bound: {row.bound})"
                + (f"  {row.detail}" if row.detail else "")
            )
        lines.append(
            "PASSED: every path trains like one replica"
            if self.passed
            else "FAILED: a path differs from one replica"
        )
        return "\n".join(lines)


def relative_update_error(start, reference, distributed) -> float:
    """The norm of the two updates' difference over the norm of the reference's update."""
    gap = [
        np.ravel(np.asarray(b, np.float64) - np.asarray(a, np.float64))
        for a, b in zip(reference, distributed)
    ]
    step = [
        np.ravel(np.asarray(a, np.float64) - np.asarray(s, np.float64))
        for s, a in zip(start, reference)
    ]
    moved = float(np.linalg.norm(np.concatenate(step))) if step else 0.0
    return float(np.linalg.norm(np.concatenate(gap))) / moved if moved else 0.0


def row_of(path, report, start, reference, distributed, tolerance) -> PathRow:
    """``path``'s row from its `VerifyReport` and the weights: at the start, trained on one
    replica, and trained on the path."""
    largest = max((v.max_difference for v in report.variables), default=0.0)
    error = relative_update_error(start, reference, distributed)
    if path.bound is None:
        ok = report.passed
        bound = f"|difference| <= {tolerance:g}"
    else:
        ok = error <= path.bound and not report.findings
        bound = f"update error <= {path.bound:.3g}"
    seen = [c for v in report.variables if v.max_difference > tolerance for c in v.causes]
    detail = list(report.findings) + ([f"likely: {seen[0]}"] if seen and not ok else [])
    return PathRow(path.name, "ok" if ok else "DIFF", largest, error, bound, "; ".join(detail))


def compare_paths(value, compare, tolerance) -> tuple:
    """``(rows, description, chief)``: each path of ``value`` (see `paths_from`) compared by
    ``compare(path)``, which returns its `VerifyReport` and the weights `row_of` reads, under the
    path's precision policy. A path tfpar's own code refuses (a ValueError or TypeError raised in
    tfpar, before or at the first step) is a "refused" row with the reason; any other error is
    raised."""
    import warnings

    from tfpar.precision import PrecisionWarning, use
    from tfpar.precision.policy import kept_policy

    rows = []
    description = ""
    chief = True
    with kept_policy():  # the caller's policy back at the end, whatever happens
        for path in paths_from(value):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", PrecisionWarning)  # mixed_float16 on a CPU
                    use(path.precision)
                report, weights = compare(path)
            except (ValueError, TypeError) as e:
                refusal = _refusal(e)
                if refusal is None:
                    raise
                rows.append(PathRow(path.name, "refused", detail=refusal))
                continue
            description = description or _common_lines(report.description)
            chief = report.chief
            start, reference, distributed = weights
            rows.append(row_of(path, report, start, reference, distributed, tolerance))
    return tuple(rows), description, chief


def _refusal(error) -> str | None:
    """tfpar's own refusal in ``error`` (raised by a line of tfpar, saying what it received), or
    None. An error raised while Keras traces a step comes wrapped, its frames listed in its
    message."""
    import os
    import re
    import traceback

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    message = str(error)
    files = re.findall(r'File "([^"]+)"', message) or [
        f.filename for f in traceback.extract_tb(error.__traceback__)
    ]
    if not files or not os.path.abspath(files[-1]).startswith(root) or "Received:" not in message:
        return None
    return re.split(r"(?:ValueError|TypeError): ", message)[-1].strip()


def _common_lines(description):
    """What every path's strategy shares, from one's description: its name, and the blocks it
    recomputes (remat's lines)."""
    lines = description.splitlines()
    return "\n".join([lines[0], *(line for line in lines if line.startswith("  remat"))])

"""What `tfpar.verify` found: each variable's largest difference from one replica with its likely
causes, the other findings, and the report as text."""

import dataclasses

__all__ = ["VariableDifference", "VerifyReport"]


@dataclasses.dataclass(frozen=True)
class VariableDifference:
    """One variable: its largest absolute difference, and the likely causes when it differs."""

    name: str
    max_difference: float
    causes: tuple = ()


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What `verify` found; ``passed`` when every variable is within ``tolerance`` and nothing
    else (loss scale, metrics, the batch) disagrees."""

    description: str
    steps: int
    tolerance: float
    variables: tuple
    findings: tuple = ()
    chief: bool = True
    """Whether this process is the job's chief (worker 0, rank 0), which prints the report."""

    @property
    def passed(self):
        return not self.findings and all(v.max_difference <= self.tolerance for v in self.variables)

    def describe(self) -> str:
        lines = [
            self.description,
            f"after {self.steps} steps from the same weights and batches "
            f"(tolerance {self.tolerance:g}):",
        ]
        width = max([len(v.name) for v in self.variables] + [8])
        causes = []
        for v in self.variables:
            line = (
                f"  {'ok  ' if v.max_difference <= self.tolerance else 'DIFF'} {v.name:<{width}}  "
                f"max |difference| {v.max_difference:.3g}"
            )
            if v.max_difference > self.tolerance:
                for cause in v.causes:
                    if cause not in causes:
                        causes.append(cause)
                line += "  likely: " + (
                    " ".join(f"[{causes.index(c) + 1}]" for c in v.causes)
                    or "no cause tfpar can detect"
                )
            lines.append(line)
        lines.extend(f"  [{n}] {cause}" for n, cause in enumerate(causes, 1))
        lines.extend(f"  {finding}" for finding in self.findings)
        lines.append(
            "PASSED: trains like one replica" if self.passed else "FAILED: differs from one replica"
        )
        return "\n".join(lines)

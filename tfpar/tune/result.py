"""What ``tfpar tune`` found: its trials ranked, the winner, the code that reproduces it (no
TensorFlow)."""

import dataclasses
import json
import re

from tfpar.tune.space import DEFAULTS

__all__ = ["TuneResult"]


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The trials of `tfpar.tune.tune`, best first, and the winner.

    Without a target the best trial is the one with the most examples per second. With one
    (``target="val_accuracy=0.95"``), it is the one that reached the target in the least wall time;
    examples per second stay as a second column, and a trial that never reached the target is
    listed as such and never wins, however fast its steps.
    """

    trials: tuple
    """Dicts: ``config``, ``status`` ("ok" or "failed"), ``examples_per_second`` or ``error``; with
    a target, ``seconds_to_target`` and ``epochs_to_target`` (None: not reached), ``curve``
    ([seconds, value] after each epoch), ``stopped`` (why it ended) and ``code`` (its optimizer and
    callbacks as Python)."""
    workers: int = 1
    """Workers (or Horovod ranks) each trial ran on."""
    target: str | None = None
    """``METRIC=VALUE`` the trials ran to, or None (ranked by throughput)."""

    def _reached(self):
        return [
            t for t in self.trials if t["status"] == "ok" and t.get("seconds_to_target") is not None
        ]

    @property
    def best(self):
        """The winner: the first to the target (with one), else the fastest successful trial; or
        None."""
        if self.target is not None:
            reached = self._reached()
            return min(reached, key=lambda t: t["seconds_to_target"]) if reached else None
        ok = [t for t in self.trials if t["status"] == "ok"]
        return max(ok, key=lambda t: t["examples_per_second"]) if ok else None

    @property
    def default(self):
        """The trial of tfpar's defaults (`DEFAULTS`), or None (a space of pipeline trials)."""
        return next((t for t in self.trials if t["config"] == DEFAULTS), None)

    @property
    def speedup(self):
        """The defaults' time to the target ÷ the winner's (with a target), else the winner's
        examples/s ÷ the defaults'; None if either has no figure."""
        best, default = self.best, self.default
        if best is None or default is None or default["status"] != "ok":
            return None
        if self.target is not None:
            seconds = default.get("seconds_to_target")
            return None if seconds is None else seconds / best["seconds_to_target"]
        return best["examples_per_second"] / default["examples_per_second"]

    def reproduce(self) -> str:
        """The command and code that train as the winner did."""
        from tfpar.tune.trial import trial_spec

        best = self.best
        if best is None:
            return ""
        config = {**DEFAULTS, **best["config"]}
        horovod = config["strategy"] == "horovod"
        env = "HOROVOD_AUTOTUNE=1 " if config.get("horovod_autotune") else ""
        launch = (
            f"{env}tfpar launch{' --horovod' if horovod else ''} -n {self.workers} -- python "
            "train.py"
            if self.workers > 1 or horovod
            else "python train.py"
        )
        code = best.get("code") or {}
        return "\n".join(
            [
                f"  {launch}",
                f"  strategy = {trial_spec(config).code()}",
                *(
                    [f"  optimizer = {code['optimizer']}  # in strategy.scope()"]
                    if code.get("optimizer")
                    else []
                ),
                f"  model.compile({'optimizer, ' if code.get('optimizer') else ''}..., "
                f"steps_per_execution={config['steps_per_execution']})",
                f"  train = tfpar.data.distribute(dataset, strategy, {config['per_replica_batch']} "
                "* strategy.num_replicas_in_sync)",
                *(
                    [f"  model.fit(train.dataset, ..., callbacks=[{code['callbacks']}])"]
                    if code.get("callbacks")
                    else []
                ),
            ]
        )

    def _cells(self, trial):
        """The figures of a trial's row: its time to the target (with one) and examples/s."""
        speed = (
            f"{trial['examples_per_second']:>12,.0f}" if trial["status"] == "ok" else f"{'-':>12}"
        )
        if self.target is None:
            return speed
        seconds = trial.get("seconds_to_target")
        return (f"{seconds:>10.1f} s" if seconds is not None else f"{'-':>12}") + f"  {speed}"

    def describe(self) -> str:
        axes = sorted({axis for t in self.trials for axis in t["config"]})
        columns = (f"  {'to target':>12}" if self.target else "") + f"  {'examples/s':>12}  status"
        lines = ["  ".join(f"{a:>19}" for a in axes) + columns]
        for trial in self.trials:
            cells = "  ".join(f"{str(trial['config'].get(a, '')):>19}" for a in axes)
            lines.append(f"{cells}  {self._cells(trial)}  {_status(trial)}")
        if self.target:
            lines.append(
                f"curves ({self.target.split('=')[0]} after each epoch, at the seconds since fit "
                "began):"
            )
            lines += [
                f"  {i + 1}: " + ", ".join(f"{s:.1f}s {v:.4g}" for s, v in t.get("curve", []))
                for i, t in enumerate(self.trials)
                if t["status"] == "ok"
            ]
        lines.append(self._verdict())
        if self.speedup is not None:
            what = "sooner than" if self.target else "speed-up over"
            lines.append(f"{what} tfpar's defaults {DEFAULTS}: {self.speedup:.2f}x")
        elif self.target and self.default is not None and self.best is not None:
            lines.append(f"tfpar's defaults {DEFAULTS} did not reach {self.target}")
        if self.best:
            lines += ["reproduce it:", self.reproduce()]
        return "\n".join(lines)

    def _verdict(self):
        best = self.best
        if self.target is None:
            return (
                f"fastest: {best['config']} at {best['examples_per_second']:,.0f} examples/s"
                if best
                else "every trial failed"
            )
        if best is None:
            return f"no trial reached {self.target}"
        return (
            f"first to {self.target}: {best['config']} in {best['seconds_to_target']:.1f} s "
            f"({best['epochs_to_target']} epochs, {best['examples_per_second']:,.0f} examples/s)"
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "best": self.best,
                "speedup": self.speedup,
                "workers": self.workers,
                "target": self.target,
                "trials": list(self.trials),
            },
            indent=2,
        )


def _status(trial):
    if trial["status"] != "ok":
        return "failed: " + error_line(trial["error"])[:100]
    stopped = trial.get("stopped")
    return "ok" if stopped in (None, "target") else f"did not reach the target ({stopped})"


def error_line(text):
    """The most telling line of a failed trial's output: the last 'SomethingError: ...' line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)]
    return (errors or lines or ["(no output)"])[-1]

"""3-stage pipelines and the 2 stages x 2 replicas hybrid against the plain model, on 4
virtual CPU devices (its own process: the device split is fixed per process). Prints JSON:
the largest weight difference and the loss histories of each configuration."""

import json
import sys

import tfpar

tfpar.configure_devices(4)

from tests.models import (  # noqa: E402
    compile_for_equivalence,
    equivalence_data,
    max_weight_difference,
    pipeline_model,
)
from tfpar.pipeline import Pipeline  # noqa: E402

x, y = equivalence_data()


def train(model):
    compile_for_equivalence(model)
    return model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0).history["loss"]


plain = pipeline_model()
report = {"plain": train(plain)}
configs = {
    f"3 stages {s}{' recompute' if r else ''}": dict(num_stages=3, schedule=s, recompute=r)
    for s in ("gpipe", "1f1b")
    for r in (False, True)
}
configs["2 stages x 2 replicas 1f1b"] = dict(num_stages=2, replicas=2, schedule="1f1b")
configs["2 stages x 2 replicas gpipe recompute"] = dict(
    num_stages=2, replicas=2, schedule="gpipe", recompute=True
)
configs["3 stages zb-h1"] = dict(num_stages=3, schedule="zb-h1")
configs["2 stages x 2 replicas interleaved"] = dict(
    num_stages=2, replicas=2, schedule="interleaved"
)
configs["2 stages x 2 replicas zb-h1 recompute"] = dict(
    num_stages=2, replicas=2, schedule="zb-h1", recompute=True
)
for name, config in configs.items():
    staged = Pipeline(num_microbatches=4, **config).stage(pipeline_model())
    loss = train(staged)
    devices = sorted({v.device.split("device:")[-1] for v in staged.trainable_variables})
    report[name] = {
        "loss": loss,
        "max_difference": max_weight_difference(staged.plain_model(), plain),
        "variable_devices": devices,
    }
json.dump(report, sys.stdout)
print()

"""One worker of the loss-scale consistency check: an inf gradient on the first worker's
replica only, under mixed_float16. Run under `tfpar launch -n 2` (DataParallel) or
`horovodrun -np 2` with --horovod (HorovodStrategy). The check runs once per Keras named on the
command line (2: tf_keras, 3: Keras 3), in turn, under one strategy. Prints
``REPORT {json}`` per Keras. With --zero (and --horovod), then Adam's under HorovodStrategy with
the optimizer state sharded over the ranks and without, per Keras ("zero": 1 or 0 in the report)."""

import importlib
import json
import sys

import tfpar
from tests.models import overflow_step, process_strategy

strategy, worker = process_strategy()
for keras_version in [a for a in sys.argv[1:] if a in ("2", "3")]:
    k = importlib.import_module("keras") if keras_version == "3" else tfpar.keras
    report = overflow_step(strategy, global_batch=8, first_worker=worker == 0, k=k)
    print("REPORT " + json.dumps({"worker": worker, "keras": keras_version, **report}), flush=True)
    for zero in (1, 0) if "--zero" in sys.argv else ():
        from tfpar.strategies.horovod import HorovodStrategy

        report = overflow_step(
            HorovodStrategy(zero_stage=zero),
            global_batch=8,
            first_worker=worker == 0,
            k=k,
            optimizer=lambda k: k.optimizers.Adam(0.01),
        )
        print(
            "REPORT "
            + json.dumps({"worker": worker, "keras": keras_version, "zero": zero, **report}),
            flush=True,
        )

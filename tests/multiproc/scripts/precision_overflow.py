"""One worker of the loss-scale consistency check: an inf gradient on the first worker's
replica only, under mixed_float16. Run under `tfpar launch -n 2` (DataParallel) or
`horovodrun -np 2` with --horovod (HorovodStrategy); the model in Keras 3 when $TFPAR_TEST_KERAS
is "3". Prints ``REPORT {json}``."""

import json

from tests.models import keras_of_env, overflow_step, process_strategy

strategy, worker = process_strategy()
report = overflow_step(strategy, global_batch=8, first_worker=worker == 0, k=keras_of_env())
print("REPORT " + json.dumps({"worker": worker, **report}), flush=True)

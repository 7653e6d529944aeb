"""One worker of the loss-scale consistency check: an inf gradient on the first worker's
replica only, under mixed_float16. Run under `tfpar launch -n 2` (DataParallel) or
`horovodrun -np 2` with --horovod (HorovodStrategy); the model in Keras 3 when $TFPAR_TEST_KERAS
is "3". Prints ``REPORT {json}``."""

import json
import sys

import tfpar
from tests.models import keras_of_env, overflow_step

if "--horovod" in sys.argv:
    from tfpar.strategies.horovod import HorovodStrategy

    strategy = HorovodStrategy()
    import horovod.tensorflow as hvd

    worker = hvd.rank()
else:
    strategy = tfpar.DataParallel(timeout_seconds=120)
    worker = tfpar.ClusterInfo.from_tf_config().worker_index
report = overflow_step(strategy, global_batch=8, first_worker=worker == 0, k=keras_of_env())
print("REPORT " + json.dumps({"worker": worker, **report}), flush=True)

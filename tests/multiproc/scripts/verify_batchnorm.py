"""`tfpar.verify.verify` over the workers of the job it runs in (multi-worker DataParallel, one
replica a worker): a model with synchronized BatchNormalization, 3 whole global batches of 32,
every variable compared, its moving statistics too. The chief prints the report."""

import tfpar
from tests.models import equivalence_data, verify_synchronized_batchnorm_model

report = tfpar.verify.verify(
    verify_synchronized_batchnorm_model, equivalence_data, steps=3, global_batch_size=32
)
if report.chief:
    print(report.describe(), flush=True)

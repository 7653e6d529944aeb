"""One script for every pod of a parameter-server TFJob: ps and worker tasks serve at
ParameterServer(); the chief trains 2 epochs; an evaluator task is refused with the way to go."""

from tfpar.strategies.parameter_server import ParameterServer

strategy = ParameterServer(connect_timeout_seconds=120)  # a ps or worker task serves here, for good
from tests.models import ps_sum_regression  # noqa: E402

model, train = ps_sum_regression(strategy, 512)
history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=2, verbose=2)
print(
    f"chief finished: loss {history.history['loss'][0]:.4f} -> {history.history['loss'][-1]:.4f}",
    flush=True,
)

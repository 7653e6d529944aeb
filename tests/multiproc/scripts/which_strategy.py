"""Prints the class tfpar.strategies.auto() picks and the replica count."""

import tfpar

strategy = tfpar.strategies.auto()
print("strategy", type(strategy).__name__, strategy.num_replicas_in_sync, flush=True)

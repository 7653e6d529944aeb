"""How the hosts of a job started on each host agree on one cluster: ``--nnodes N`` (`static`:
node 0 gathers every node's ports and hands out one cluster) and ``--nnodes MIN:MAX``
(`elastic`: every host's agent stays connected, one round a membership). Pure Python."""

__all__: list[str] = []

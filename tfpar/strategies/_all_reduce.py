"""`DataParallel`'s all-reduce implementations, one entry each: the choices of ``all_reduce``, the
error messages that name them (the refusals below) and `describe` are read from this table.

To add one: an `AllReduce` entry in `ALL_REDUCES` (its one-host builder, its multi-worker
implementation or both, whether it packs, whether it needs GPUs) and its test; nothing else.
"""

import dataclasses

from tfpar._keras import tf

__all__ = [
    "ALL_REDUCES",
    "AllReduce",
    "has_gpus",
    "multi_worker_names",
    "one_host_names",
    "quoted",
    "refuse_multi_worker_only",
    "refuse_num_packs",
    "refuse_one_host_only",
    "refuse_without_gpus",
]


@dataclasses.dataclass(frozen=True)
class AllReduce:
    """One value of ``DataParallel(all_reduce=...)``."""

    name: str
    one_host: object = None
    """``(num_packs) -> CrossDeviceOps or None`` (None: TensorFlow's choice) for one host; None if
    it runs across workers only."""
    multi_worker: object = None
    """``(has_gpus) -> CommunicationImplementation`` across workers; None if it runs on one host
    only."""
    packs: bool = False
    """It batches the gradients into ``num_packs`` packs (one host)."""
    needs_gpus: bool = False
    """It runs on GPUs only."""


def _impl(name):
    return getattr(tf.distribute.experimental.CommunicationImplementation, name)


ALL_REDUCES = {
    entry.name: entry
    for entry in (
        AllReduce(
            "auto",
            one_host=lambda packs: None,  # TensorFlow's collective all-reduce over local devices
            multi_worker=lambda has_gpus: _impl("NCCL" if has_gpus else "RING"),
        ),
        AllReduce(
            "nccl",
            one_host=lambda packs: tf.distribute.NcclAllReduce(num_packs=packs),
            multi_worker=lambda has_gpus: _impl("NCCL"),
            packs=True,
            needs_gpus=True,
        ),
        AllReduce("ring", multi_worker=lambda has_gpus: _impl("RING")),
        AllReduce(
            "hierarchical",
            one_host=lambda packs: tf.distribute.HierarchicalCopyAllReduce(num_packs=packs),
            packs=True,
        ),
        AllReduce("reduce_to_one", one_host=lambda packs: tf.distribute.ReductionToOneDevice()),
    )
}
"""Every all-reduce ``DataParallel`` takes, by name, in the order its documentation lists them."""


def one_host_names():
    """The names that run on one host."""
    return [name for name, entry in ALL_REDUCES.items() if entry.one_host is not None]


def multi_worker_names():
    """The names that run across workers."""
    return [name for name, entry in ALL_REDUCES.items() if entry.multi_worker is not None]


def quoted(names, last="or"):
    """``'a', 'b' or 'c'``."""
    names = [repr(n) for n in names]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def refuse_num_packs(all_reduce, num_packs):
    """``num_packs`` other than 1 with an all-reduce that does not pack: refused, naming the ones
    that do."""
    if num_packs != 1 and not ALL_REDUCES[all_reduce].packs:
        packing = sorted((e for e in ALL_REDUCES.values() if e.packs), key=lambda e: e.needs_gpus)
        fixes = " or ".join(
            f"{e.name!r} ({'GPUs' if e.needs_gpus else 'any devices'})" for e in packing
        )
        raise ValueError(
            "num_packs applies to "
            f"all_reduce={quoted([e.name for e in ALL_REDUCES.values() if e.packs])} only; "
            f"all_reduce={all_reduce!r} would ignore it. Received: "
            f"all_reduce={all_reduce!r}, num_packs={num_packs}. Use "
            f"all_reduce={fixes} to pack gradients, or leave num_packs at 1."
        )


def refuse_one_host_only(all_reduce, num_workers):
    """An all-reduce that runs on one host only, in a cluster of ``num_workers`` workers."""
    if ALL_REDUCES[all_reduce].multi_worker is None:
        raise ValueError(
            f"all_reduce={all_reduce!r} works on one host only; this cluster has "
            f"{num_workers} workers. Use {quoted(multi_worker_names())}."
        )


def refuse_multi_worker_only(all_reduce):
    """An all-reduce that runs across workers only, with one worker."""
    if ALL_REDUCES[all_reduce].one_host is None:
        raise ValueError(
            f"all_reduce={all_reduce!r} needs several workers; one host uses "
            f"{quoted(one_host_names())}. Received: all_reduce={all_reduce!r} with one "
            "worker."
        )


def has_gpus():
    """Whether this process sees a GPU."""
    return bool(tf.config.list_physical_devices("GPU"))


def refuse_without_gpus(all_reduce):
    """Raises ValueError if ``all_reduce`` needs GPUs and this process has none."""
    if ALL_REDUCES[all_reduce].needs_gpus and not has_gpus():
        raise ValueError(
            f"all_reduce={all_reduce!r} needs GPUs and none was found. Received: "
            f"all_reduce={all_reduce!r}. Use all_reduce='auto' on CPUs."
        )

"""`TensorParallel`: which layers of a model are split, how many ways, on which devices.

``TensorParallel(degree=2, plan={"up": "column", "down": "row"}).shard(model)`` returns a
`TensorParallelModel` (`model.py`) that ``compile``/``fit``/``evaluate``/``predict`` accept
unchanged; each device holds 1/degree of each planned layer's weights and of their optimizer slots.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfpar import _owned
from tfpar._checks import check_int, config_from
from tfpar._keras import check_keras_model, keras_of
from tfpar._parallelism import PlacesItself
from tfpar._topology import Topology
from tfpar.remat import check_remat, remat_check, remat_lines
from tfpar.tensor_parallel.accounting import describe_bytes, describe_gathers
from tfpar.tensor_parallel.layouts import is_layout_map, model_axis_of, styles_from_layouts
from tfpar.tensor_parallel.model import TensorParallelModel
from tfpar.tensor_parallel.nested import layer_tree, nested_auto_plan
from tfpar.tensor_parallel.pairs import auto_plan
from tfpar.tensor_parallel.plan import LAYERS_OF_STYLE, match_plan, parse_style
from tfpar.tensor_parallel.rules import kind_of, split_error

__all__ = ["TensorParallel", "TensorParallelConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorParallelConfig:
    """Configuration of `TensorParallel`, validated when built."""

    plan: Any = "auto"
    """Layer path (its name at the top level; ``"backbone/block_0/attention"`` inside) or a regular
    expression matched against whole paths -> style: "column", "row" (Dense, EinsumDense; or
    "column:<kernel axis>"), "heads" (MultiHeadAttention) or "vocab" (Embedding); unplanned layers
    are replicated. "auto": every MultiHeadAttention by heads, every Embedding by vocabulary, and
    the Dense layers an MLP or an attention pairs as columns then rows, at any depth, where the
    degree divides them. Or a ``keras.distribution.LayoutMap`` (KerasHub's
    ``Backbone.get_layout_map(mesh)``): its layouts over the mesh's model axis (`layouts.py`)."""
    degree: int | None = None
    """T: the devices each planned layer is split over (default: 2, or a LayoutMap mesh's model
    axis)."""
    batch_axis: str = "batch"
    """With a LayoutMap plan: its mesh's data-parallel axis (1, or one per worker of the job)."""
    devices: tuple | None = None
    """Device names (default: the first ``degree`` GPUs, else logical CPU devices); the first is the
    home device, where the replicated layers run."""
    remat: Any = "none"
    """Activation checkpointing of the split model (`tfpar.remat`): "none", "blocks" (each block,
    its split layers inside) or a list of layer names and patterns. On one host."""

    def __post_init__(self):
        object.__setattr__(self, "remat", check_remat(self.remat))
        if not isinstance(self.batch_axis, str):
            raise TypeError(
                f"batch_axis names a mesh axis (a str). Received: batch_axis={self.batch_axis!r}."
            )
        if self.degree is not None:
            check_int("degree", self.degree, 1)
        if type(self.plan).__name__ in ("ModelParallel", "DataParallel", "DeviceMesh"):
            raise TypeError(
                f"plan takes a LayoutMap, a dict of layer paths to styles, or 'auto'. Received: "
                f"plan={self.plan!r}. For a keras.distribution.ModelParallel use "
                "TensorParallel.from_distribution(distribution); for its layouts, plan=layout_map."
            )
        if is_layout_map(self.plan):
            _, size = model_axis_of(self.plan.device_mesh, self.batch_axis)
            if self.degree not in (None, size):
                raise ValueError(
                    f"degree is the LayoutMap mesh's model axis ({size}) when plan is a LayoutMap. "
                    f"Received: degree={self.degree!r}. Leave degree out, or make the mesh's model "
                    f"axis {self.degree}."
                )
            object.__setattr__(self, "degree", size)
        elif self.degree is None:
            object.__setattr__(self, "degree", 2)
        if self.plan != "auto" and not is_layout_map(self.plan):
            keys = list(self.plan) if isinstance(self.plan, Mapping) else []
            match_plan(self.plan, keys)  # its types and styles; the layers are checked by shard()
        if self.devices is not None:
            from tfpar.devices import check_devices

            object.__setattr__(self, "devices", check_devices("devices", self.devices))
            if len(set(self.devices)) != len(self.devices):
                raise ValueError(
                    f"devices must be distinct: a layer's parts on one device split nothing. "
                    f"Received: devices={list(self.devices)!r}. Name each device once."
                )


class TensorParallel(PlacesItself):
    """Tensor (intra-layer) parallelism for Keras models (tf_keras or Keras 3): ``shard(model)``
    returns the split model.

    Megatron-LM's splits over ``degree`` devices: Dense/EinsumDense by columns or rows (an MLP
    pair costs one all-reduce forward and one backward, no gather between them),
    MultiHeadAttention by heads, Embedding by vocabulary. Not a ``tf.distribute.Strategy``: it
    places the parts itself, in this process, under TensorFlow's default strategy. Under
    ``tfpar launch`` with several workers, each worker's split model is a data-parallel replica (a
    one-stage `tfpar.pipeline.Pipeline` across workers), so create it first, before TensorFlow runs
    anything.

    Args:
        config: a `TensorParallelConfig`, or its fields as keyword arguments.

    Examples:
        >>> tfpar.configure_devices(2)  # doctest: +SKIP
        >>> tp = tfpar.tensor_parallel.TensorParallel(  # doctest: +SKIP
        ...     degree=2, plan={"up": "column", "down": "row"}
        ... )
        >>> model = tp.shard(model)  # doctest: +SKIP
        >>> model.compile("adam", "sparse_categorical_crossentropy")  # doctest: +SKIP
        >>> model.fit(x, y, batch_size=64)  # doctest: +SKIP
        >>> model.plain_model().save("model.keras")  # doctest: +SKIP
    """

    CONFIG = TensorParallelConfig

    @classmethod
    def from_distribution(cls, distribution: Any, **kwargs: Any) -> "TensorParallel":
        """`TensorParallel` from a ``keras.distribution.ModelParallel`` as a Keras 3 script for JAX
        builds it: its layout map is the plan, its mesh's model axis the degree, its batch axis
        the data-parallel replicas (the workers of ``tfpar launch``).

        Raises:
            TypeError: not a ``ModelParallel``.
        """
        layout_map = getattr(distribution, "_layout_map", None)
        if type(distribution).__name__ != "ModelParallel" or not is_layout_map(layout_map):
            raise TypeError(
                "from_distribution takes a keras.distribution.ModelParallel(layout_map=...). "
                f"Received: {distribution!r}. For data parallelism alone use tfpar.DataParallel."
            )
        return cls(plan=layout_map, batch_axis=distribution.batch_dim_name, **kwargs)

    def __init__(self, config: TensorParallelConfig | None = None, **kwargs: Any) -> None:
        self.config = c = config_from(TensorParallelConfig, config, kwargs)
        from tfpar.pipeline import Pipeline
        from tfpar.pipeline.workers import Workers

        if c.remat != "none" and Workers.several():
            raise ValueError(
                "remat with TensorParallel across workers (each worker's split model a replica) "
                f"is not supported yet. Received: remat={c.remat!r} in a job of several workers. "
                "Use remat on one host's TensorParallel, or DataParallel(remat=...) across workers."
            )

        # Across workers (TF_CONFIG), each worker's split model is a data-parallel replica: the
        # pipeline's replicas, with one stage.
        across = Pipeline(
            num_stages=1,
            num_microbatches=1,
            tensor_parallel=c.degree,
            tensor_plan=c.plan,
            tensor_batch_axis=c.batch_axis,
            devices=c.devices,
        )
        self._across = across if across.workers else None
        if is_layout_map(c.plan):
            _check_batch_axis(c.plan.device_mesh, c.batch_axis, across.workers)

    @property
    def num_replicas_in_sync(self):
        """One copy of the model per worker: the devices split its layers, not its batch."""
        return self._across.num_replicas_in_sync if self._across else 1

    @property
    def topology(self):
        """One replica in this process; one of the job's workers."""
        return self._across.topology if self._across else Topology(replicas_per_worker=1)

    def devices(self) -> list[str]:
        """The ``degree`` devices the planned layers are split over; the first is the home device.

        Raises:
            ValueError: fewer devices than ``degree``.
        """
        from tfpar.devices import local_devices

        names = list(self.config.devices or local_devices())
        degree = self.config.degree
        if len(names) < degree:
            raise ValueError(
                f"Tensor parallelism over degree={degree} devices needs {degree} devices. "
                f"Received: {len(names)} ({names}). "
                f"Call tfpar.configure_devices({degree}) before TensorFlow starts (or pass "
                f"devices=), or use degree <= {len(names)}."
            )
        return names[:degree]

    def model_checks(self) -> tuple:
        """The split model's checks (`tfpar._owned`): ``remat``'s blocks set up before ``fit``."""
        return (*super().model_checks(), *remat_check(self.config.remat))

    def styles(self, model: Any) -> dict[str, str]:
        """``{layer name: style}`` of ``model``'s planned layers, each checked
        (`planned_styles`)."""
        return planned_styles(model, self.config.degree, self.config.plan, self.config.batch_axis)

    def split(self, model: Any) -> Any:
        """`shard`."""
        return self.shard(model)

    def shard(self, model: Any) -> Any:
        """Splits ``model``'s planned layers over the devices and returns the `TensorParallelModel`.

        The original model is left as it is; `TensorParallelModel.plain_model` copies the trained
        weights back into it.

        Raises:
            TypeError: not a Keras model.
            ValueError: a subclassed model, a plan that does not fit it (see `styles`), a model
                that its config does not build again (a plan inside it), or too few devices.
        """
        check_keras_model(model)
        from tfpar import _compat

        if not _compat.is_graph_network(model):
            raise ValueError(
                f"Tensor parallelism splits a Sequential or Functional model's layers. Received: "
                f"{model.name!r}, a subclassed model. Build it with the functional API."
            )
        styles = self.styles(model)  # the plan first: it is wrong whatever the devices
        devices = self.devices()
        if self._across:
            return self._across.stage(model)
        return _owned.own(TensorParallelModel(model, styles, devices), self.model_checks())

    def describe(self, global_batch_size: int | None = None, model: Any = None) -> str:
        """A readable summary: the mesh, the plan and, given the split model, the bytes each device
        holds."""
        c = self.config
        if self._across:
            return self._across.describe(global_batch_size, model)
        lines = [
            f"TensorParallel (mesh: data 1 x pipeline 1 x tensor {c.degree})",
            f"  devices:    {self.devices()}",
            f"  plan:       {c.plan if c.plan == 'auto' else dict(c.plan)}",
        ]
        if global_batch_size is not None:
            lines.append(f"  batch:      {global_batch_size}, whole on every device")
        if isinstance(model, TensorParallelModel):
            lines[2] = f"  plan:       {model.styles}"
            lines += describe_bytes(model.device_bytes())
            lines += describe_gathers(model.gathers())
        lines += remat_lines(c.remat, model if isinstance(model, TensorParallelModel) else None)
        return "\n".join(lines)


def planned_styles(model: Any, degree: int, plan: Any, batch_axis: str = "batch") -> dict[str, str]:
    """``{layer path: style}`` of ``model``'s planned layers for ``plan`` ("auto", layer path or
    pattern -> style, or a ``keras.distribution.LayoutMap`` read along the mesh axis that is not
    ``batch_axis``) over ``degree`` devices, each checked.

    Raises:
        TypeError: a LayoutMap for a model whose variables have no paths (tf_keras).
        ValueError: a plan key that names no layer, a layer the style cannot split, a size the
            degree does not divide, a layout tfpar cannot realise or one that splits nothing.
    """
    k = keras_of(model)
    if is_layout_map(plan):
        axis, _ = model_axis_of(plan.device_mesh, batch_axis)
        styles = styles_from_layouts(model, plan, axis, k)
        if not styles:
            raise ValueError(
                f"The layout map splits no variable of {model.name!r} over the mesh's model axis "
                f"{axis!r}: every weight would be whole on every device. Received: layouts "
                f"{ {key: tuple(plan[key].axes) for key in plan.keys()} }. Put {axis!r} in the "
                "layouts of the kernels to split, or use tfpar.DataParallel."
            )
        return _checked(model, styles, degree, k)
    if plan == "auto":
        styles = auto_styles(model, degree)
        if not styles:
            raise ValueError(
                f"plan='auto' found no layer of {model.name!r} to split {degree} ways: no "
                "MultiHeadAttention, Embedding or Dense pair whose size the degree divides. "
                f"Received: degree={degree}. Name the layers in plan=, or use another degree."
            )
        return styles
    return _checked(model, match_plan(plan, list(layer_tree(model))), degree, k)


def auto_styles(model: Any, degree: int) -> dict[str, str]:
    """The default plan's ``{layer path: style}`` for ``model`` over ``degree`` devices; ``{}`` when
    it finds nothing to split."""
    k = keras_of(model)
    nested = nested_auto_plan(model, degree, k)  # {} when every candidate is a top-level layer
    return nested or auto_plan(model, degree, k)


def _checked(model, styles, degree, k):
    """``styles`` ({layer path: style}), each checked against its layer."""
    tree = layer_tree(model)
    for name, style in styles.items():
        layer = tree[name]
        kind = kind_of(layer, style, k)
        if kind is None:
            kind_name = type(layer).__name__
            fitting = [s for s, kinds in LAYERS_OF_STYLE.items() if kind_name in kinds]
            raise ValueError(
                f"layer {name!r} is a {kind_name}, and style {style!r} splits "
                f"{' or '.join(LAYERS_OF_STYLE[parse_style(style)[0]])} layers. Received: "
                f"plan[{name!r}]={style!r}. Use a style for a {kind_name} "
                f"({fitting or 'none: leave it replicated'})."
            )
        error = split_error(layer, style, degree, kind)
        if error:
            raise ValueError(error)
    return styles


def _check_batch_axis(mesh, batch_axis, workers):
    """A LayoutMap mesh's batch axis must be 1 or the job's workers (each one replica)."""
    if batch_axis not in mesh.axis_names:
        return
    size = mesh.shape[list(mesh.axis_names).index(batch_axis)]
    count = workers.num_workers if workers else 1
    if size not in (1, count):
        raise ValueError(
            f"The LayoutMap mesh's {batch_axis!r} axis is {size}: data-parallel replicas, one per "
            f"worker of tfpar launch. Received: a job of {count} worker(s). Make that axis "
            f"{count}, or launch as many workers."
        )

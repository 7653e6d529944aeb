"""`Pipeline`: how a model is cut into stages, on which devices, under which schedule.

``Pipeline(num_stages=2, num_microbatches=8, schedule="1f1b").stage(model)``
cuts a Sequential or Functional model, tf_keras or Keras 3 (`partition.py`) and returns a
`PipelineModel` (`model.py`) that ``compile``/``fit``/``evaluate``/``predict``
accept unchanged. With ``replicas=R`` each replica runs the pipeline on its own
devices (R × stages devices). Its options are a `PipelineConfig` (`config.py`), re-exported
here.
"""

import logging
from typing import Any

from tfpar import _owned
from tfpar._checks import config_from
from tfpar._keras import all_layers, check_keras_model, keras_of
from tfpar._parallelism import PlacesItself
from tfpar._topology import Topology
from tfpar.pipeline.config import PipelineConfig
from tfpar.pipeline.model import PipelineModel
from tfpar.pipeline.partition import cut_positions, partition_model
from tfpar.pipeline.schedule import make_schedule
from tfpar.pipeline.workers import Workers
from tfpar.remat import remat_check, remat_lines

__all__ = ["Pipeline", "PipelineConfig"]

_log = logging.getLogger("tfpar.pipeline")


class Pipeline(PlacesItself):
    """Pipeline parallelism for Keras models (tf_keras or Keras 3): ``stage(model)`` returns the
    staged model.

    Not a ``tf.distribute.Strategy``: it places each stage's variables itself and runs its
    replicas in this process, under TensorFlow's default strategy. It offers what tfpar's
    strategies do (`tfpar._parallelism`): ``build(model_fn)``, ``scope()``,
    ``num_replicas_in_sync``, ``input_strategy`` and ``describe()``.

    Args:
        config: a `PipelineConfig`, or its fields as keyword arguments.

    Examples:
        >>> tfpar.configure_devices(2)  # doctest: +SKIP
        >>> pipeline = tfpar.pipeline.Pipeline(num_stages=2, num_microbatches=8)  # doctest: +SKIP
        >>> staged = pipeline.stage(model)  # doctest: +SKIP
        >>> print(staged.partition.describe())  # doctest: +SKIP
        >>> staged.compile(  # doctest: +SKIP
        ...     "adam", "sparse_categorical_crossentropy", metrics=["accuracy"]
        ... )
        >>> staged.fit(x, y, batch_size=64, epochs=5)  # doctest: +SKIP
        >>> staged.plain_model().save("model.keras")  # doctest: +SKIP
    """

    CONFIG = PipelineConfig
    _FIX = (
        "Build and compile the pipeline outside it; for data parallelism across pipelines use "
        "replicas=."
    )

    def __init__(self, config: PipelineConfig | None = None, **kwargs: Any) -> None:
        self.config = config = config_from(PipelineConfig, config, kwargs)
        self.schedule = make_schedule(
            config.schedule, config.num_stages, config.num_microbatches, config.virtual_stages
        )
        self.cluster = None  # with span_workers: the job whose workers' devices hold the stages
        if config.span_workers:
            from tfpar.devices import check_devices
            from tfpar.pipeline.spanning import join_spanning

            # another worker serves there
            self.cluster = join_spanning(config.connect_timeout_seconds)
            if config.devices is not None:
                check_devices("devices", config.devices)
            # its refusals here, at once: too few stages or devices for the workers
            self.devices()
        # several workers in TF_CONFIG: each runs its pipeline, a replica (unless the pipeline
        # spans them)
        self.workers = None if config.span_workers else Workers.join()

    @property
    def num_replicas_in_sync(self):
        """The data-parallel copies of the pipeline that split the global batch (on every
        worker)."""
        return self.config.replicas * (self.workers.num_workers if self.workers else 1)

    @property
    def topology(self):
        """This process, running the pipeline's ``replicas`` copies itself; one of the job's
        workers."""
        if self.workers is None:
            return Topology(replicas_per_worker=self.config.replicas)
        return Topology(
            num_workers=self.workers.num_workers,
            worker_index=self.workers.worker_index,
            replicas_per_worker=self.config.replicas,
        )

    def devices(self) -> list[list[str]]:
        """The device grid: ``devices()[replica][stage]`` (with ``tensor_parallel`` > 1, a tuple of
        a stage's devices).

        Raises:
            ValueError: fewer devices than replicas × num_stages (× tensor_parallel); with
                ``span_workers``, fewer stages than workers or a worker with too few devices.
        """
        from tfpar.devices import local_devices
        from tfpar.pipeline.spanning import cluster_devices, spread

        c = self.config
        t = c.tensor_parallel
        if c.devices:
            names = list(c.devices)
        elif self.cluster:  # spanning the workers: the stages spread over them
            names = spread(cluster_devices(self.cluster), c.replicas, c.num_stages, t)
        else:
            names = local_devices()
        needed = c.replicas * c.num_stages * t
        if len(names) < needed:
            product = f"replicas × num_stages{' × tensor_parallel' if t > 1 else ''}"
            values = f"{c.replicas} × {c.num_stages}{f' × {t}' if t > 1 else ''}"
            raise ValueError(
                f"The pipeline needs {product} = {values} = {needed} "
                f"devices. Received: {len(names)} ({names}). "
                f"Call tfpar.configure_devices({needed}) "
                "before TensorFlow starts (or pass devices=), or use fewer stages or replicas."
            )
        if t == 1:
            return [names[r * c.num_stages : (r + 1) * c.num_stages] for r in range(c.replicas)]
        return [
            [
                tuple(names[(r * c.num_stages + k) * t : (r * c.num_stages + k + 1) * t])  # type: ignore[misc]
                for k in range(c.num_stages)
            ]
            for r in range(c.replicas)
        ]

    def split(self, model: Any) -> Any:
        """`stage`."""
        return self.stage(model)

    def stage(self, model: Any) -> Any:
        """Cuts ``model`` into stages on their devices and returns the `PipelineModel`.

        The original model is left as it is; `PipelineModel.plain_model` copies the
        trained weights back into it.

        Raises:
            TypeError: not a Keras model.
            ValueError: a subclassed model, more stages than layers or devices, a bad cut.
        """
        check_keras_model(model)
        c = self.config
        partition = self._partition(model)  # the cut and the plan first: wrong whatever the devices
        styles = self._tensor_styles(model, partition)
        grid = self.devices()
        if any(
            isinstance(layer, keras_of(model).layers.BatchNormalization)
            for layer in all_layers(model)
        ):
            _log.warning(
                "%s has BatchNormalization: in a pipeline its batch statistics come from "
                "each microbatch (the batch / %d examples), as with a smaller batch, and "
                "its moving averages are updated once per microbatch.",
                model.name,
                c.num_microbatches * c.replicas,
            )
        staged = PipelineModel(
            model,
            partition,
            grid,
            self.schedule,
            recompute=c.recompute,
            tensor_styles=styles,
            workers=self.workers,
        )
        return _owned.own(staged, self.model_checks())

    def _tensor_styles(self, model, partition):
        """With tensor_parallel > 1, each chunk's layer styles: "auto" finds each chunk's splits
        within it; a plan is checked against the whole model, then each chunk takes its layers'
        part."""
        c = self.config
        if c.tensor_parallel == 1:
            return None
        from tfpar.pipeline.flat import FlatChunk
        from tfpar.pipeline.flat_stage import chunk_styles
        from tfpar.tensor_parallel.sharding import auto_styles, planned_styles

        # split where they sit
        if any(isinstance(chunk, FlatChunk) for chunk in partition.models):
            styles = planned_styles(model, c.tensor_parallel, c.tensor_plan, c.tensor_batch_axis)
            return [chunk_styles(model, chunk, styles) for chunk in partition.models]

        if c.tensor_plan == "auto":
            chunks = [auto_styles(chunk, c.tensor_parallel) for chunk in partition.models]
            if not any(chunks):
                # its refusal: nothing to split
                planned_styles(model, c.tensor_parallel, c.tensor_plan)
            return chunks
        styles = planned_styles(model, c.tensor_parallel, c.tensor_plan, c.tensor_batch_axis)
        # A path's first name is the chunk's top-level layer that holds it.
        return [
            {
                path: style
                for path, style in styles.items()
                if path.split("/")[0] in {layer.name for layer in chunk.layers}
            }
            for chunk in partition.models
        ]

    def _partition(self, model):
        """The model cut into num_stages × virtual_stages chunks (the stages without virtual
        ones)."""
        c, v = self.config, self.schedule.virtual_stages
        if v == 1:
            return partition_model(model, c.num_stages, c.cut_points, c.balance, c.layer_costs)
        cuts = len(cut_positions(model)) if c.cut_points == "auto" else len(c.cut_points)
        if c.num_stages * v > cuts + 1:
            valid = [k for k in range(2, (cuts + 1) // c.num_stages + 1)]
            none_valid = (
                "" if valid else f" (this model cannot be interleaved over {c.num_stages} stages)"
            )
            raise ValueError(
                f"virtual_stages={v} cuts {model.name!r} into num_stages × virtual_stages = "
                f"{c.num_stages * v} chunks, and it has {cuts} valid cut point(s), so at most "
                f"{cuts + 1} chunks. Received: virtual_stages={v} with num_stages={c.num_stages}. "
                f"Valid: virtual_stages in {valid or 'none'}{none_valid}."
            )
        return partition_model(model, c.num_stages * v, c.cut_points, c.balance, c.layer_costs)

    def model_checks(self) -> tuple:
        """`Parallelism.model_checks`, and remat's blocks set up before fit (`tfpar.remat`)."""
        return (*super().model_checks(), *remat_check(self.config.remat))

    def describe(self, global_batch_size: int | None = None, model: Any = None) -> str:
        """A readable summary: schedule, devices, bubble and memory figures."""
        c, s = self.config, self.schedule
        lines = [
            f"Pipeline ({s.name}: {c.num_stages} stages x {c.num_microbatches} microbatches"
            f"{f' x {c.replicas} replicas' if c.replicas > 1 else ''})",
            f"  mesh:       data {self.num_replicas_in_sync} x pipeline {c.num_stages} "
            f"x tensor {c.tensor_parallel}"
            + (
                f" ({self.workers.num_workers} workers x {c.replicas} replicas; this is worker "
                f"{self.workers.worker_index})"
                if self.workers
                else ""
            )
            + (
                f" (stages over the devices of {self.cluster.num_workers} workers; worker 0 runs "
                "it)"
                if self.cluster
                else ""
            ),
            f"  devices:    {self.devices()}",
            f"  bubble:     {100 * s.bubble_fraction:.1f}% (theory, {s.bubble_formula})",
            "  activations held per stage: "
            + ", ".join(str(s.peak_activations(k)) for k in range(c.num_stages))
            + (
                " microbatches"
                if s.virtual_stages == 1
                else f" (chunk, microbatch) pairs, a chunk 1/{s.virtual_stages} of a stage"
            ),
        ]
        if global_batch_size is not None:
            lines.append(
                f"  batch:      {global_batch_size} global, "
                f"{global_batch_size / (c.replicas * c.num_microbatches):g} per microbatch"
            )
        if model is not None:
            lines.append(
                model.partition.describe()
                if isinstance(model, PipelineModel)
                else f"  model:      {model.name}, {model.count_params():,} parameters"
            )
        lines += remat_lines(c.remat, model)
        if isinstance(model, PipelineModel) and c.tensor_parallel > 1:  # what each device holds
            from tfpar.tensor_parallel.accounting import bytes_by_device, describe_bytes

            # A split stage's own (its inner model's, not its step trace); a flattened stage's.
            weights = [w for stage in model.stages for w in getattr(stage, "inner", stage).weights]
            lines += describe_bytes(bytes_by_device(weights, getattr(model, "optimizer", None)))
        return "\n".join(lines)

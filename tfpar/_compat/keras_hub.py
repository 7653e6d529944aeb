"""KerasHub's task models' ``fit`` (part of `tfpar._compat`, the one place that touches private
TensorFlow/Keras APIs; it re-exports this): ``PipelineModel.fit`` takes arrays, ``tf.data`` and
grain datasets only, maps the model's preprocessor over them, and calls Keras' ``fit``."""

import sys


def keras_hub_fit(model, x):
    """For a KerasHub task model given a distributed dataset (`tfpar.data.distribute`'s), with no
    preprocessor to map over it: the Keras ``fit`` its ``PipelineModel.fit`` wraps, which takes
    one; else None (any other model, input, or a subclass's own ``fit``).

    Raises:
        ValueError: the model has a preprocessor, which a distributed dataset cannot be mapped with.
    """
    module = sys.modules.get("keras_hub.src.utils.pipeline_model")
    pipeline = getattr(module, "PipelineModel", None)
    if pipeline is None or not isinstance(model, pipeline) or type(model).fit is not pipeline.fit:
        return None
    import tensorflow as tf

    if not isinstance(x, tf.distribute.DistributedDataset):
        return None
    preprocessor = getattr(model, "preprocessor", None)
    if preprocessor is not None:
        raise ValueError(
            "KerasHub's fit maps the model's preprocessor over its input, and a distributed "
            "dataset (tfpar.data.distribute's) cannot be mapped. Received: a "
            f"{type(model).__name__} with preprocessor {type(preprocessor).__name__} and a "
            "distributed dataset. Map it in the input pipeline before tfpar.data.distribute "
            "(dataset.map(model.preprocessor)), then set model.preprocessor = None."
        )
    classes = type(model).__mro__
    for cls in classes[classes.index(pipeline) + 1 :]:
        if "fit" in vars(cls):
            return vars(cls)["fit"]
    return None

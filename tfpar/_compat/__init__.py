"""The one place tfpar reaches private TensorFlow, tf_keras and tensorflow-model-optimization APIs.

Each symbol says what tfpar needs it for and which public API is missing.
``tests/unit/test_compat.py`` touches every one on real objects, so a TensorFlow or
tf_keras upgrade that moves one fails there, by name, instead of somewhere in a run.
Everything else in tfpar uses public APIs, or this module. One module by what it reaches:
`distribute` (tf.distribute and runtime internals), `tf_keras`, `keras3`, `models` (both
Kerases' models and optimizers), `graph` (both Kerases' functional graphs), `collectives`,
`allocator`, `keras_hub`, `tfmot` and `ray`; each name is re-exported here.
"""

from tfpar._compat.allocator import (
    keep_malloc_policy,
    onednn_enabled,
)
from tfpar._compat.collectives import (
    collective_all_gather,
    collective_all_reduce,
    collective_all_to_all,
    keep_started_collective_server,
    set_collective_key_base,
)
from tfpar._compat.distribute import (
    CROSS_DEVICE_OPS_HOOKS,
    MIRRORED_EXTENDED_HOOKS,
    CollectiveAllReduceExtended,
    Mirrored,
    MirroredExtended,
    PerReplica,
    ResourceVariable,
    Trackable,
    assign_moving_average,
    cross_device_ops_of,
    get_distributed_dataset,
    get_distributed_datasets_from_function,
    in_xla_context,
    mirrored,
    ps_num_workers,
    stop_removing_functions,
    tape_recording,
    unwrap_initial_value,
)
from tfpar._compat.graph import (
    graph_steps,
    is_graph_network,
    keras_layer_of,
    layer_nodes_in,
    node_layer,
    output_structure,
)
from tfpar._compat.keras3 import (
    keras3_compute_loss,
    keras3_data_adapter_class,
    keras3_loss_tracker,
    keras3_own_trainable_variables,
    keras3_remat_mode,
    keras3_replace_storage,
    keras3_start_at_epoch,
    keras3_tf_optimizer_class,
    keras3_trainer_class,
    optimizer_steps,
    stop_keras3_remat,
)
from tfpar._compat.keras_hub import (
    keras_hub_fit,
)
from tfpar._compat.models import (
    current_learning_rate,
    fit_arguments,
    flatten_layers,
    given_learning_rate,
    losses_added,
    training_of_the_call,
)
from tfpar._compat.ray import (
    ray_resources_per_worker,
)
from tfpar._compat.tf_keras import (
    KERAS_CALLBACK_HOOKS,
    KERAS_READS_FROM_EXTENDED,
    DatasetCreatorAdapter,
    print_msg,
    random_generator_type,
    replace_data_adapter,
    take_logs_as_they_are,
    tf_keras_mark_optimizer_built,
    tf_keras_model_class,
    tf_keras_own_trainable_weights,
    tf_keras_replace_weight,
    tf_keras_resume_point,
    tf_keras_set_resume_point,
    tf_keras_trained_variables,
)
from tfpar._compat.tfmot import (
    tfmot_can_cluster,
    tfmot_quant_ops,
    tfmot_wrapper_classes,
)

__all__ = [
    "CROSS_DEVICE_OPS_HOOKS",
    "CollectiveAllReduceExtended",
    "DatasetCreatorAdapter",
    "KERAS_CALLBACK_HOOKS",
    "KERAS_READS_FROM_EXTENDED",
    "MIRRORED_EXTENDED_HOOKS",
    "Mirrored",
    "MirroredExtended",
    "PerReplica",
    "ResourceVariable",
    "Trackable",
    "assign_moving_average",
    "collective_all_gather",
    "collective_all_reduce",
    "collective_all_to_all",
    "cross_device_ops_of",
    "current_learning_rate",
    "fit_arguments",
    "flatten_layers",
    "get_distributed_dataset",
    "get_distributed_datasets_from_function",
    "given_learning_rate",
    "graph_steps",
    "in_xla_context",
    "is_graph_network",
    "keep_malloc_policy",
    "keep_started_collective_server",
    "keras3_compute_loss",
    "keras3_data_adapter_class",
    "keras3_loss_tracker",
    "keras3_own_trainable_variables",
    "keras3_remat_mode",
    "keras3_replace_storage",
    "keras3_start_at_epoch",
    "keras3_tf_optimizer_class",
    "keras3_trainer_class",
    "keras_hub_fit",
    "keras_layer_of",
    "layer_nodes_in",
    "losses_added",
    "mirrored",
    "node_layer",
    "onednn_enabled",
    "optimizer_steps",
    "output_structure",
    "print_msg",
    "ps_num_workers",
    "random_generator_type",
    "ray_resources_per_worker",
    "replace_data_adapter",
    "set_collective_key_base",
    "stop_keras3_remat",
    "stop_removing_functions",
    "take_logs_as_they_are",
    "tape_recording",
    "training_of_the_call",
    "tf_keras_mark_optimizer_built",
    "tf_keras_model_class",
    "tf_keras_own_trainable_weights",
    "tf_keras_replace_weight",
    "tf_keras_resume_point",
    "tf_keras_set_resume_point",
    "tf_keras_trained_variables",
    "tfmot_can_cluster",
    "tfmot_quant_ops",
    "tfmot_wrapper_classes",
    "unwrap_initial_value",
]

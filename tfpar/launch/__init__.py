"""``tfpar launch``: start a job's processes with the right roles and TF_CONFIG.

On one machine, ``launch(cmd, num_workers=2)`` starts every task on
127.0.0.1 with free ports. On several machines each one runs
``tfpar launch --hosts a:2222,b:2222 --task-index K -- cmd``, which starts
just its own task. Every output line is prefixed with its task
(``[worker 1] ...``); Ctrl-C is forwarded to every task; when a task fails
the others are stopped and the launcher exits non-zero naming it.

Pure Python: the launcher never imports TensorFlow, so it starts at once.
"""

from tfpar._local.processes import LaunchError, check_command, run_command
from tfpar._tasks.env import FAULT_TOLERANCE_MARK, RESTART_VARIABLE, STATE_VARIABLE
from tfpar.launch.api import launch, load_cluster_file
from tfpar.launch.config import LaunchConfig
from tfpar.launch.job import SERVER_COMMAND, Task, local_tasks
from tfpar.launch.runner import LaunchOptions, run_tasks

__all__ = [
    "FAULT_TOLERANCE_MARK",
    "LaunchConfig",
    "LaunchError",
    "LaunchOptions",
    "RESTART_VARIABLE",
    "SERVER_COMMAND",
    "STATE_VARIABLE",
    "Task",
    "check_command",
    "launch",
    "load_cluster_file",
    "local_tasks",
    "run_command",
    "run_tasks",
]

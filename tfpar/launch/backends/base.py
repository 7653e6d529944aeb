"""What every back-end of ``tfpar launch`` is (`Backend`), and the helpers several share: this
host's workers' environments and tasks."""

from tfpar.launch.api import task_env_pairs
from tfpar.launch.config import LaunchConfig
from tfpar.launch.job import Task

__all__ = ["Backend", "worker_envs", "worker_tasks"]


class Backend:
    """How ``tfpar launch`` starts a job's tasks. Stateless: what a job needs is on its
    `LaunchConfig`."""

    name = ""

    def chosen(self, config: LaunchConfig) -> bool:
        """Whether the command line asks for this back-end."""
        raise NotImplementedError

    def check(self, config: LaunchConfig) -> None:
        """Raises ValueError, naming the option, for what this back-end cannot take."""

    def start(self, config: LaunchConfig) -> int:
        """Runs the job; returns its exit code (0) or raises `tfpar.launch.LaunchError`."""
        raise NotImplementedError

    def run(self, config: LaunchConfig) -> int:
        """`check`, then `start`."""
        self.check(config)
        return self.start(config)


def worker_envs(nproc_per_node: int) -> list[dict]:
    """This host's workers' device environments (`tfpar.launch.node.worker_envs`), its warning
    printed."""
    from tfpar.launch.node import worker_envs as envs_of

    envs, warning = envs_of(nproc_per_node)
    if warning:
        print(f"tfpar launch: {warning}", flush=True)
    return envs


def worker_tasks(first_index: int, envs: list[dict]) -> list[Task]:
    """This host's worker tasks, numbered from ``first_index``, each with its environment."""
    return [
        Task(task_type="worker", task_index=first_index + i, env=task_env_pairs(env))
        for i, env in enumerate(envs)
    ]

"""What ``tfpar launch`` tells the tasks it starts, through their environment (no imports: ``import
tfpar`` reads it)."""

__all__ = [
    "BACKUP_MARK",
    "ELASTIC_VARIABLE",
    "FAULT_TOLERANCE_MARK",
    "GROW_REQUEST",
    "HEARTBEAT_VARIABLE",
    "RESTART_VARIABLE",
    "STATE_VARIABLE",
    "TIMELINE_VARIABLE",
]

RESTART_VARIABLE = "TFPAR_RESTART_COUNT"
"""Set in every task: how many times `launch` has restarted the job (0 on the first run)."""
STATE_VARIABLE = "TFPAR_LAUNCH_DIR"
"""Set in every task: a folder the job's tfpar callbacks tell the launcher things through."""
FAULT_TOLERANCE_MARK = "fault_tolerance"
"""The file `tfpar.callbacks.FaultTolerance` writes in `STATE_VARIABLE`'s folder: training
resumes."""
BACKUP_MARK = "backed_up"
"""The file FaultTolerance's chief touches in that folder after each backup."""
GROW_REQUEST = "grow"
"""The file an elastic launch writes in that folder when it may grow the job: after its next backup
(unless that is training's last), FaultTolerance's chief touches `BACKUP_MARK` and waits to be
stopped, so the job restarts larger from that backup and no step is trained twice."""
ELASTIC_VARIABLE = "TFPAR_ELASTIC"
"""Set in every worker of an elastic launch: JSON ``{"reference_workers": R, "min_workers": M,
"batch": B}`` (`tfpar._tasks.elastic_batch.ElasticBatch`): how the global batch is kept when the job
has fewer than R workers."""
HEARTBEAT_VARIABLE = "TFPAR_HEARTBEAT_FILE"
"""The file a task's heartbeat goes to; set by ``tfpar launch --heartbeat-timeout``."""
TIMELINE_VARIABLE = "TFPAR_TIMELINE"
"""A folder: ``tfpar launch --timeline DIR`` sets it, and every ``fit`` of a model tfpar owns then
writes DIR/timeline.json."""

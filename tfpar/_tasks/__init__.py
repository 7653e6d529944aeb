"""The contract between `tfpar launch` and its tasks, which both sides import and neither owns:
what the launcher tells a task through its environment (`env`), the heartbeat files a task writes
and the launcher watches (`heartbeat`), the Timeline's folder and Horovod-timeline merge
(`timeline_files`), and the elastic batch policy the training runtime reads (`elastic_batch`).
Pure Python: the training runtime imports these, never the launcher."""

__all__: list[str] = []

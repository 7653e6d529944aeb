"""Elastic jobs: the hosts discovery lists (`discovery`), which slots the job has (`membership`),
the elastic job on this host (`local`) and a host's agent of a job across hosts (`agent`).
Pure Python."""

__all__: list[str] = []

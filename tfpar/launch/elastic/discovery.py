"""Elastic local jobs: the workers a job may have, from Horovod's host discovery (a script or a file
printing ``host:slots`` lines), and which of them it has now. Pure Python: `tfpar.launch` runs the
job; which slots it has is `tfpar.launch.elastic.membership`.

A worker's place is a *slot* of a host ("localhost slot 1"). The job runs one worker per slot of the
hosts discovery lists, at most ``max_workers``, and needs ``min_workers``. A slot whose worker
failed more than ``max_restarts`` times is dropped while its host stays listed; a host that leaves
the list takes its slots with it, and brings them back, fresh, when it returns. Every host must be
this machine (`tfpar launch` starts local processes; across hosts, each host's agent of ``--nnodes
MIN:MAX`` starts its own, `tfpar.launch.rendezvous.elastic`).
"""

import dataclasses
import ipaddress
import os
import socket
import stat
import subprocess
from collections import Counter

__all__ = ["DISCOVERY_PERIOD_SECONDS", "SCRIPT_TIMEOUT_SECONDS", "Discovery", "parse_host_lines"]

DISCOVERY_PERIOD_SECONDS = 1.0
"""How often a running elastic job asks discovery again (Horovod's period too)."""
SCRIPT_TIMEOUT_SECONDS = 30.0
"""How long a discovery script may take to answer."""


def parse_host_lines(text: str, source: str) -> dict[str, int]:
    """``{host: slots}`` from discovery output: one ``host`` or ``host:slots`` a line (blank lines
    and ``#`` comments skipped; a host listed twice adds its slots).

    Raises:
        ValueError: a line that is not ``host[:slots]`` with slots an int >= 1, naming ``source``.
    """
    hosts: Counter = Counter()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, slots = (
            line.rpartition(":") if ":" in line and not line.endswith("]") else (line, "", "1")
        )
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]  # [::1]:2
        if not host or any(c.isspace() for c in host) or not slots.isdigit() or int(slots) < 1:
            raise ValueError(
                f"{source} printed line {number} that is not host:slots. Received: {raw!r}. Each "
                "line names a host and how many workers it takes, as Horovod's host discovery "
                "does: e.g. 'localhost:2'."
            )
        hosts[host] += int(slots)
    return dict(hosts)


def _this_machine(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in ("localhost", socket.gethostname(), socket.getfqdn())


@dataclasses.dataclass(frozen=True)
class Discovery:
    """Where the hosts come from: ``script`` (run; its output read) or ``file`` (read), or neither
    (then ``fixed`` slots on this machine)."""

    script: str | None = None
    file: str | None = None
    fixed: int = 1

    def __post_init__(self):
        if self.script is not None and self.file is not None:
            raise ValueError(
                "Give a host discovery script or a file, not both. Received: "
                f"--host-discovery-script {self.script} and --host-discovery-file {self.file}."
            )
        if self.script is not None:
            if not os.path.isfile(self.script):
                raise ValueError(
                    f"The host discovery script does not exist. Received: --host-discovery-script "
                    f"{self.script}. Give the path of an executable that prints host:slots lines."
                )
            if not os.stat(self.script).st_mode & (
                stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
            ) or not os.access(self.script, os.X_OK):
                raise ValueError(
                    "The host discovery script is not executable. Received: "
                    f"--host-discovery-script {self.script}. Run `chmod +x {self.script}` (Horovod "
                    "needs it executable too)."
                )
        if self.file is not None and not os.path.isfile(self.file):
            raise ValueError(
                "The host discovery file does not exist. Received: --host-discovery-file "
                f"{self.file}. Give a file of host:slots lines (it is read again while the job "
                "runs)."
            )

    @property
    def source(self):
        """How messages name it."""
        if self.script is not None:
            return f"the host discovery script {self.script}"
        return f"the host discovery file {self.file}" if self.file is not None else "this machine"

    def hosts(self) -> dict[str, int]:
        """``{host: slots}`` now.

        Raises:
            ValueError: output that does not parse, a script that fails, or a host that is not this
                machine.
        """
        if self.script is None and self.file is None:
            return {"localhost": self.fixed}
        if self.script is not None:
            try:
                done = subprocess.run(
                    [os.path.abspath(self.script)],
                    capture_output=True,
                    text=True,
                    timeout=SCRIPT_TIMEOUT_SECONDS,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise ValueError(
                    f"{self.source} did not answer within {SCRIPT_TIMEOUT_SECONDS:g} s."
                ) from None
            if done.returncode:
                raise ValueError(
                    f"{self.source} exited with code {done.returncode}: "
                    f"{done.stderr.strip()[-500:]}"
                )
            text = done.stdout
        else:
            with open(str(self.file), encoding="utf-8") as f:
                text = f.read()
        hosts = parse_host_lines(text, self.source)
        others = [h for h in hosts if not _this_machine(h)]
        if others:
            raise ValueError(
                f"{self.source} lists hosts other than this machine: {others}. Received: {hosts}. "
                "An elastic tfpar launch starts its workers on this machine (name it localhost, "
                "127.0.0.1 or its host name); across machines, run tfpar launch --nnodes MIN:MAX "
                "--master-addr HOST on each, or Horovod's elastic mode (horovodrun "
                "--host-discovery-script)."
            )
        return hosts

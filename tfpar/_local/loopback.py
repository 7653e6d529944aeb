"""Loopback-only servers for local jobs: an interposed ``bind`` that turns "any address" into
loopback.

TensorFlow's gRPC server listens on ``0.0.0.0:<port>`` (or ``[::]:<port>``) whatever address
the cluster gives the task, and offers no option to change it; Horovod's rendezvous server
does the same. A job whose tasks all run on this machine needs none of that: every task
reaches the others on 127.0.0.1. So the processes of a local job (``tfpar launch`` without
``--hosts``/``--cluster``, the servers of ``ParameterServer.local()``, ``tfpar demo``) start
with ``LD_PRELOAD`` naming a small library, compiled here once per source and cached, whose
``bind`` replaces a wildcard address by loopback: 127.0.0.1, or ``::ffff:127.0.0.1`` for a
dual-stack IPv6 socket (so IPv4 clients still reach it), ``::1`` for an IPv6-only one. Every
other bind, and every outgoing connection, is left as it is: a local job can still read
remote files. A network namespace would also close the ports, but it cuts those too.

Without a C compiler the library cannot be built: the job then runs as before, and each
server says in one line which ports it opens on all interfaces.
"""

import hashlib
import os
import shutil
import subprocess
import tempfile

__all__ = [
    "LIBRARY_NAME",
    "active",
    "build_error",
    "child_env",
    "job_listeners",
    "library",
    "listening",
    "open_ports_warning",
    "start_again_with_library",
    "warning_unless_active",
]

LIBRARY_NAME = "libtfpar_loopback.so"

_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static bind_fn real_bind;
  if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
  } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      int v6only = 0;
      socklen_t size = sizeof v6only;
      getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &size);
      if (v6only) {
        a.sin6_addr = in6addr_loopback;
      } else {
        memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
        a.sin6_addr.s6_addr[10] = 0xff;
        a.sin6_addr.s6_addr[11] = 0xff;
        a.sin6_addr.s6_addr[12] = 127;
        a.sin6_addr.s6_addr[15] = 1;
      }
      return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
  }
  return real_bind(fd, addr, len);
}
"""

_built: dict = {}  # this process's answer: {"path": ...} or {"error": ...}


def _cache_dir():
    digest = hashlib.sha256((_SOURCE + os.uname().machine).encode()).hexdigest()[:16]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(root, "tfpar", "loopback", digest)


def library():
    """The library's path, compiled on first use (atomically, into the cache); None without a
    compiler.

    `build_error` says why it is None.
    """
    if not _built:
        _built.update(_build())
    return _built.get("path")


def _build():
    folder = _cache_dir()
    path = os.path.join(folder, LIBRARY_NAME)
    if os.path.isfile(path):
        return {"path": path}
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return {"error": "no C compiler (cc) to build tfpar's loopback library"}
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
        source = os.path.join(tmp, "loopback.c")
        with open(source, "w", encoding="utf-8") as f:
            f.write(_SOURCE)
        built = os.path.join(tmp, LIBRARY_NAME)
        try:
            done = subprocess.run(
                [compiler, "-shared", "-fPIC", "-O2", "-o", built, source, "-ldl"],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"{compiler} failed: {e}"}
        if done.returncode != 0:
            return {"error": f"{compiler} failed: {(done.stderr or done.stdout).strip()[-300:]}"}
        # a whole library or none: a concurrent build renames the same bytes
        os.replace(built, path)
    return {"path": path}


def child_env(env):
    """``env`` with the library first in ``LD_PRELOAD`` (a new dict); ``env`` itself if it cannot be
    built."""
    path = library()
    if path is None:
        return env
    others = [
        p for p in env.get("LD_PRELOAD", "").split() if p and os.path.basename(p) != LIBRARY_NAME
    ]
    return {**env, "LD_PRELOAD": " ".join([path, *others])}


RESTARTED_VARIABLE = "TFPAR_LOOPBACK_REEXEC"
"""Set in a process `start_again_with_library` started again: it is not started a second time."""


def start_again_with_library(argv=None, say=None):
    """Replaces this process by the same command run with the library (``os.execve``), so that the
    servers it will start in itself listen on loopback: a library cannot be preloaded into a
    process that already runs. Call it before this process starts a server or a child.

    Args:
        argv: the command to run (default: this process' own Python command line,
            ``sys.orig_argv``).
        say: a line to print on stderr first (what is started again, and why).

    Returns:
        Only when it cannot: why not (no compiler, an interactive session, children of this process
        that a restart would leave behind, or the library not loaded after a restart).
    """
    import sys

    if library() is None:
        return build_error()
    if os.environ.get(RESTARTED_VARIABLE):
        return (
            "this process was already started again with the library, and the library is not "
            "loaded in it"
        )
    if argv is None:
        if (
            hasattr(sys, "ps1")
            or sys.flags.interactive
            or "ipykernel" in sys.modules
            or sys.argv[0] in ("", "-")
        ):
            return (
                "an interactive session (a notebook, the Python prompt, a script read from stdin) "
                "cannot be started again"
            )
        children = _children()
        if children:
            return (
                f"this process already runs {len(children)} process(es) of its own (pid "
                f"{', '.join(map(str, children[:5]))}), which starting it again would leave behind"
            )
        argv = list(sys.orig_argv)
    if say:
        print(say, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, {**child_env(dict(os.environ)), RESTARTED_VARIABLE: "1"})


def _children():
    """The pids of this process' children that still run."""
    me = str(os.getpid())
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == me and fields[0] != "Z":
            found.append(int(pid))
    return found


def active():
    """Whether this process runs with the library (its binds to any address become loopback)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            return any(line.rstrip().endswith("/" + LIBRARY_NAME) for line in f)
    except OSError:
        return False


def build_error():
    """Why `library` is None (after a call to it), else None."""
    return _built.get("error")


def open_ports_warning(what, ports, reason):
    """The one line naming the ports ``what`` opens on every interface, and why."""
    return (
        f"WARNING: {what} listens on all interfaces, port(s) {', '.join(map(str, ports))}, without "
        f"authentication ({reason}): anyone who can reach them can run code in this job. Run it "
        "on a trusted network or firewall these ports (README, Security)."
    )


def warning_unless_active(what, ports):
    """`open_ports_warning` for this process, or None when its binds are kept to loopback."""
    if active():
        return None
    return open_ports_warning(
        what,
        ports,
        "its process runs without tfpar's loopback library: a "
        "multi-host job, or one not started by tfpar",
    )


def listening(pid="self"):
    """``(address, port)`` of every TCP socket listening in ``pid``'s network namespace.

    Read from ``/proc/<pid>/net/tcp`` and ``tcp6``, so nothing is sent anywhere. An IPv6
    address that maps IPv4 (``::ffff:127.0.0.1``) is given as its IPv4 address.
    """
    return [(address, port) for address, port, _ in _listen_rows(pid)]


def _listen_rows(pid):
    import ipaddress
    import socket
    import struct

    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid}/net/{name}", encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            # The kernel prints the address as 32-bit words in host order.
            words = struct.unpack(f"<{len(raw) // 4}I", raw)
            address = ipaddress.ip_address(struct.pack(f">{len(words)}I", *words))
            if family == socket.AF_INET6 and address.ipv4_mapped:
                address = address.ipv4_mapped
            yield str(address), int(hex_port, 16), fields[9]


def job_listeners():
    """What the running processes of tfpar jobs (those with a TF_CONFIG) listen on, from /proc.

    Returns ``[(task name, pid, address, port)]``, for the processes this user may inspect.
    """
    import json

    sockets = {inode: (address, port) for address, port, inode in _listen_rows("self")}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            if b"TF_CONFIG" not in env:
                continue
            task = json.loads(env[b"TF_CONFIG"]).get("task", {})
            name = f"{task.get('type')} {task.get('index', 0)}"
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except (OSError, ValueError, AttributeError):
            continue  # gone, not ours, or not a TF_CONFIG we can read
        for link in links:
            if link.startswith("socket:[") and link[8:-1] in sockets:
                found.append((name, int(pid), *sockets[link[8:-1]]))
    return sorted(found)

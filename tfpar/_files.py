"""Files written whole or not at all: a temporary file in the same folder, then a rename."""

import os
import tempfile

__all__ = ["check_folder_of", "write_atomically"]


def check_folder_of(name, path):
    """Raises ValueError unless the folder that would hold ``path`` exists (checked before work
    starts)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(
            f"{name} must be a file in an existing folder. Received: {name}={path!r} ({folder} "
            "does not exist). Create the folder first, or give another path."
        )


def write_atomically(path, data):
    """Writes ``data`` (str or bytes) to ``path``: readers see the old file or the whole new one.

    A crash or a full disk while writing leaves ``path`` as it was and no temporary file.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask

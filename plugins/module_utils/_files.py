# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files on a host: read, write atomically (mode and owner set before the file appears)."""
from __future__ import annotations

import json
import os
import tempfile


def read_bytes(path):
    """A file's bytes, or None when it cannot be read (missing, a directory, no permission)."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def write_atomic(path, data, mode, owner=None):
    """Write `data` to `path` through a temporary file in the same directory and a rename.

    `owner` is (uid, gid) or None. The temporary file gets its mode and owner before the rename,
    so a reader sees the old file or the whole new one, never a partial or too-open one.
    """
    directory = os.path.dirname(path) or "."
    handle, tmp = tempfile.mkstemp(prefix=".gpufleet-", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        if owner is not None:
            os.chown(tmp, owner[0], owner[1])
        os.rename(tmp, path)
    except Exception:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path, data, mode=0o644, default=None):
    """`data` as indented JSON (keys sorted, a newline at the end), atomically; makes the directory.

    `default` as for json.dumps: None fails on a value JSON cannot hold (nothing is written).
    """
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    text = json.dumps(data, indent=2, sort_keys=True, default=default) + "\n"
    write_atomic(path, text.encode("utf-8"), mode)

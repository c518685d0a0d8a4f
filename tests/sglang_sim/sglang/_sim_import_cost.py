"""What ``import sglang`` costs on a real host (simulator-only module).

Real 0.5.23 takes ~4 s and ~450 MB RSS to import (torch and friends).  Set
SGLANG_SIM_IMPORT_SECONDS to sleep that long at ``import sglang`` and
SGLANG_SIM_IMPORT_MB to allocate and touch that much memory, kept until the
process exits.  Both default to 0.  ``importlib.metadata.version("sglang")``
reads the dist-info and does not import the package, so it does not pay.
"""
import os
import time

_BALLAST = []  # kept for the process lifetime, like the real imported modules
_PAGE = 4096


def _env_float(name):
    try:
        return max(0.0, float(os.environ.get(name, "0") or 0))
    except ValueError:
        return 0.0


def pay_import_cost():
    megabytes = _env_float("SGLANG_SIM_IMPORT_MB")
    if megabytes:
        size = int(megabytes * 1024 * 1024)
        block = bytearray(size)
        block[::_PAGE] = b"\x01" * len(range(0, size, _PAGE))  # touch every page: real RSS
        _BALLAST.append(block)
    seconds = _env_float("SGLANG_SIM_IMPORT_SECONDS")
    if seconds:
        time.sleep(seconds)

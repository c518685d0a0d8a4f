"""Which SGLang release the simulator pretends to be (simulator-only module).

Order: env SGLANG_SIM_VERSION, else the file SIM_VERSION next to this module,
else 0.5.11.  Each release has a profile, ``srt/profiles/<version>.json``: its
argparse actions and ServerArgs fields, dumped from the real wheel by
``tools/extract_flags.py``.
"""
import json
import os

DEFAULT_VERSION = "0.5.11"
SUPPORTED = ["0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16",
             "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
_PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "srt", "profiles")
_CACHE = {}


def selected_version():
    env = os.environ.get("SGLANG_SIM_VERSION", "").strip()
    if env:
        return env
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "SIM_VERSION")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read().strip()
        if text:
            return text
    except OSError:
        pass
    return DEFAULT_VERSION


def version_tuple(version=None):
    version = version or selected_version()
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts[:3])


def at_least(minimum, version=None):
    return version_tuple(version) >= version_tuple(minimum)


def profile_version(version=None):
    """The dumped release whose tables stand for ``version``: the newest one not after it."""
    wanted = version_tuple(version)
    chosen = SUPPORTED[0]
    for candidate in SUPPORTED:
        if version_tuple(candidate) <= wanted:
            chosen = candidate
    return chosen


def load_profile(version=None):
    """{"version", "flags": [argparse actions], "fields": [ServerArgs fields]} of a release."""
    name = profile_version(version)
    if name not in _CACHE:
        with open(os.path.join(_PROFILE_DIR, name + ".json"), encoding="utf-8") as handle:
            _CACHE[name] = json.load(handle)
    return _CACHE[name]

"""Which SGLang release the simulator pretends to be (simulator-only module).

Order: env SGLANG_SIM_VERSION, else the file SIM_VERSION next to this module,
else 0.5.11.
"""
import os

DEFAULT_VERSION = "0.5.11"
SUPPORTED = ["0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16",
             "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]


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

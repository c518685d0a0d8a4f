"""SGLang simulator (stdlib only).  See tests/sglang_sim/README.md."""
from sglang.version import __version__  # noqa: F401

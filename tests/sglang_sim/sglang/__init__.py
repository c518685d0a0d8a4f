"""SGLang simulator (stdlib only).  See tests/sglang_sim/README.md."""
from sglang._sim_import_cost import pay_import_cost as _pay_import_cost
from sglang.version import __version__  # noqa: F401

_pay_import_cost()

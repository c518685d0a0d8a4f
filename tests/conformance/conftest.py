"""Fixtures of the conformance layer: the real SGLang 0.5.23 (cached venv) and the simulator.

Every check runs the project's own preflight (plugins/module_utils/_preflight.py CHECK_SCRIPT)
inside the interpreter under test, through worker.py: one import of SGLang per side and per
session, one fork per args list.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SIM = REPO / "tests" / "sglang_sim"
REAL_VERSION = "0.5.23"
sys.path.insert(0, str(HERE))

import build_venv  # noqa: E402  (tests/conformance/build_venv.py)


def _preflight():
    # Imported when first used, not with this conftest: pytest-ansible's collection loader
    # must be in place before the collection is imported (as for the test modules).
    from ansible_collections.gpufleet.inference.plugins.module_utils import _preflight as module

    return module


class Side:
    """One SGLang under test: an interpreter and its environment."""

    def __init__(self, name, python, env):
        self.name, self.python, self.env = name, str(python), env

    def run(self, argv, timeout=600):
        return subprocess.run([self.python, *argv], capture_output=True, text=True, env=self.env,
                              timeout=timeout, cwd="/", check=False)

    def worker(self, request, timeout=1800):
        """worker.py with `request`; its response (raises with the worker's stderr on failure)."""
        with tempfile.TemporaryDirectory() as tmp:
            req, resp = Path(tmp) / "request.json", Path(tmp) / "response.json"
            req.write_text(json.dumps(dict(request, script=_preflight().CHECK_SCRIPT)))
            proc = self.run([str(HERE / "worker.py"), str(req), str(resp)], timeout=timeout)
            if proc.returncode != 0 or not resp.exists():
                raise AssertionError("%s worker failed (rc %s):\n%s"
                                     % (self.name, proc.returncode, proc.stderr[-4000:]))
            return json.loads(resp.read_text())

    def preflight(self, args):
        """The preflight exactly as a module runs it: `python -c CHECK_SCRIPT args`."""
        preflight = _preflight()
        proc = subprocess.run(preflight.check_command(self.python, args), capture_output=True,
                              text=True, env=self.env, timeout=600, cwd="/", check=False)
        return preflight.parse_check_output(proc.returncode, proc.stdout, proc.stderr)


def _base_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SGLANG_", "PYTHON", "CUDA_", "VIRTUAL_ENV"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # SGLang and torch create cache directories under ~ on import: not in the user's home.
    env["HOME"] = str(build_venv.cache_root() / "home")
    env["HF_HUB_OFFLINE"] = "1"  # placeholder models are local directories; never ask a hub
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env


@pytest.fixture(scope="session")
def real():
    # Builds the venv on first use (minutes), reuses it afterwards (see build_venv.py).
    python = build_venv.ensure()
    return Side("real sglang " + REAL_VERSION, python, _base_env())


@pytest.fixture(scope="session")
def sim():
    env = _base_env()
    env["PYTHONPATH"] = str(SIM)
    env["SGLANG_SIM_VERSION"] = REAL_VERSION
    return Side("simulator " + REAL_VERSION, sys.executable, env)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Placeholder model directories: a config.json each, no weights, no tokenizer."""
    from cases import write_models

    return write_models(tmp_path_factory.mktemp("models"))

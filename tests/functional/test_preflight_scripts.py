# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight scripts, run for real (processes) against the simulator.

The same scripts run against the real SGLang 0.5.23 in tests/conformance; their output parsers
are unit-tested in tests/unit/plugins/module_utils/test_preflight.py.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _preflight
from ansible_collections.gpufleet.inference.plugins.module_utils._preflight import (
    REDACTED, check_command, parse_check_output, parse_version_output, version_command)

REPO = Path(__file__).resolve().parents[2]
SIM = REPO / "tests" / "sglang_sim"
KEY = "s3cr3t-KEY.value"


def run(argv, pythonpath=(), version=None, extra_env=None, cwd=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHONPATH"))}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    if version:
        env["SGLANG_SIM_VERSION"] = version
    env.update(extra_env or {})
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, cwd=cwd, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def sim_check(args, version, **kwargs):
    return parse_check_output(*run(check_command(sys.executable, args), [SIM], version, **kwargs))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target, draft = root / "target", root / "draft"
    for path in (target, draft):
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      "model_type": "llama"}))
    return str(target), str(draft)


def dflash(models, block=16, window=2048, window_flag="--speculative-draft-window-size"):
    target, draft = models
    args = ["--model-path", target, "--tp-size", "8", "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", draft]
    if block is not None:
        args += ["--speculative-num-draft-tokens", str(block)]
    if window is not None:
        args += [window_flag, str(window)]
    return args


# ------------------------------------------------------------------ commands

def test_commands_are_argv_lists_of_the_hosts_python():
    assert version_command("/opt/sglang/venv/bin/python")[:2] == ["/opt/sglang/venv/bin/python", "-c"]
    argv = check_command("/opt/sglang/venv/bin/python", ["--model-path", "/m", "--tp-size", 8])
    assert argv[:3] == ["/opt/sglang/venv/bin/python", "-c", _preflight.CHECK_SCRIPT]
    assert argv[3:] == ["--model-path", "/m", "--tp-size", "8"]


def test_scripts_are_valid_python():
    compile(_preflight.VERSION_SCRIPT, "<version>", "exec")
    compile(_preflight.CHECK_SCRIPT, "<check>", "exec")


# ------------------------------------------------------------------ version, for real

@pytest.mark.parametrize("version", ["0.5.11", "0.5.19", "0.5.23"])
def test_version_without_metadata_imports_and_says_so(version):
    result = parse_version_output(*run(version_command(sys.executable), [SIM], version))
    assert result["version"] == version
    assert result["source"] == "import"
    assert "no package metadata" in result["error"]


def test_version_from_metadata_never_imports(tmp_path):
    # An installed distribution whose import would blow up: metadata must be enough.
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("raise SystemExit('imported!')\n")
    info = tmp_path / "sglang-0.5.19.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.19\n")
    rc, out, err = run(version_command(sys.executable), [tmp_path])
    assert rc == 0, err
    assert parse_version_output(rc, out, err) == {"version": "0.5.19", "source": "metadata",
                                                  "error": None}


def test_version_when_sglang_is_not_installed(tmp_path):
    rc, out, err = run(version_command(sys.executable), [tmp_path])
    result = parse_version_output(rc, out, err)
    assert rc == 1
    assert result["version"] is None and result["source"] is None
    assert result["error"] == "ModuleNotFoundError: No module named 'sglang'"


# ------------------------------------------------------------------ check, for real (simulator)

@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
def test_check_passes_the_k26_dflash_args(models, version):
    result = sim_check(dflash(models), version)
    assert result["ok"], result
    assert result["stage"] == "resolve" and result["error"] is None
    assert "argparse (prepare_server_args)" in result["checked"]
    assert "ServerArgs.resolve_once()" in result["checked"]
    assert any("GPUs are hidden" in item for item in result["unchecked"])


def test_check_on_a_release_validating_in_post_init(models):
    result = sim_check(dflash(models, window_flag="--speculative-dflash-draft-window-size"), "0.5.11")
    assert result["ok"], result
    assert "argparse and ServerArgs.__post_init__ (prepare_server_args)" in result["checked"]
    assert "ServerArgs.resolve_once()" not in result["checked"]


@pytest.mark.parametrize("version, window, error", [
    ("0.5.23", 8, "--speculative-draft-window-size must be >= --speculative-num-draft-tokens"
                  " (block_size). window_size=8, block_size=16."),
    ("0.5.23", 0, "--speculative-draft-window-size must be positive, got 0."),
    ("0.5.19", 8, "--speculative-draft-window-size must be >= --speculative-num-draft-tokens"
                  " (block_size). window_size=8, block_size=16."),
])
def test_check_reports_a_value_error_at_resolution(models, version, window, error):
    result = sim_check(dflash(models, window=window), version)
    assert result == {"ok": False, "stage": "resolve", "error": error, "exception": "ValueError",
                      "checked": result["checked"], "unchecked": result["unchecked"]}
    assert "ServerArgs.resolve_once()" not in result["checked"]  # it is what failed


def test_check_reports_argparse_exit_2(models):
    result = sim_check(dflash(models, window_flag="--speculative-dflash-draft-window-size"), "0.5.23")
    assert not result["ok"]
    assert result["stage"] == "parse"
    assert result["exception"] == "SystemExit"
    assert result["error"] == ("sglang serve: error: unrecognized arguments:"
                               " --speculative-dflash-draft-window-size 2048")


def test_check_reports_a_missing_value(models):
    result = sim_check(["--model-path", models[0], "--tp-size"], "0.5.23")
    assert (result["ok"], result["stage"]) == (False, "parse")
    assert result["error"] == "sglang serve: error: argument --tp-size/--tensor-parallel-size: expected one argument"


def test_check_without_sglang_fails_at_import(tmp_path, models):
    rc, out, err = run(check_command(sys.executable, dflash(models)), [tmp_path])
    result = parse_check_output(rc, out, err)
    assert rc == 1
    assert (result["ok"], result["stage"]) == (False, "import")
    assert result["error"] == "No module named 'sglang'"
    assert result["exception"] == "ModuleNotFoundError"


def test_check_ignores_a_sglang_in_the_callers_cwd(tmp_path, models):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("raise SystemExit('imported from cwd')\n")
    result = parse_check_output(*run(check_command(sys.executable, dflash(models)), [SIM], "0.5.23",
                                     cwd=tmp_path))
    assert result["ok"], result


def test_check_of_a_process_killed_mid_check_names_its_stage(tmp_path, models):
    fake = tmp_path / "sglang" / "srt"
    fake.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (fake / "__init__.py").write_text("")
    (fake / "server_args.py").write_text(
        "import os, signal\n"
        "class ServerArgs: pass\n"
        "def prepare_server_args(argv):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    rc, out, err = run(check_command(sys.executable, dflash(models)), [tmp_path])
    assert rc == -9
    result = parse_check_output(rc, out, err)
    assert result == {"ok": False, "stage": "parse", "error": "no answer (killed by signal 9)",
                      "exception": None, "checked": [], "unchecked": []}


def test_check_hides_the_gpus_from_sglang(tmp_path, models):
    fake = tmp_path / "sglang" / "srt"
    fake.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (fake / "__init__.py").write_text("")
    (fake / "server_args.py").write_text(
        "import os\n"
        "class ServerArgs: pass\n"
        "def prepare_server_args(argv):\n"
        "    raise ValueError('CUDA_VISIBLE_DEVICES=%r argv=%r' % (os.environ.get('CUDA_VISIBLE_DEVICES'), argv[-2:]))\n")
    result = parse_check_output(*run(check_command(sys.executable, ["--model-path", "/m"]), [tmp_path],
                                     extra_env={"CUDA_VISIBLE_DEVICES": "0,1"}))
    assert result["stage"] == "resolve"  # no resolve_once: __post_init__-style validation
    assert result["error"] == "CUDA_VISIBLE_DEVICES='' argv=['--device', 'cuda']"


def test_check_keeps_an_explicit_device(tmp_path, models):
    # SGLang refuses DFLASH on the CPU: the device given is the device checked.
    result = sim_check(dflash(models) + ["--device", "cpu"], "0.5.23")
    assert (result["ok"], result["stage"]) == (False, "resolve")
    assert "on device 'cpu'" in result["error"]
    assert not any("--device cuda added" in item for item in result["checked"])


def test_check_never_returns_the_api_key(tmp_path, models):
    # A typo in the YAML (api_key: instead of api-key:) makes SGLang echo the key in its error.
    config = tmp_path / "sglang.yaml"
    config.write_text("api_key: %s\n" % KEY)
    rc, out, err = run(check_command(sys.executable, dflash(models) + ["--config", str(config)]),
                       [SIM], "0.5.23")
    result = parse_check_output(rc, out, err)
    assert (result["ok"], result["stage"]) == (False, "parse")
    assert "unrecognized arguments: --api_key" in result["error"]
    assert KEY not in json.dumps(result) and KEY not in out
    assert REDACTED in result["error"]


def test_check_with_the_api_key_in_a_config_file_passes(tmp_path, models):
    config = tmp_path / "sglang.yaml"
    config.write_text("api-key: %s\n" % KEY)
    rc, out, err = run(check_command(sys.executable, dflash(models) + ["--config", str(config)]),
                       [SIM], "0.5.23")
    result = parse_check_output(rc, out, err)
    assert result["ok"], result
    assert KEY not in out


# ------------------------------------------------------------------ parsers, table-driven

"""CLI surface per version profile: argparse errors, aliases, DFLASH validation."""
import os
import subprocess
import sys

import pytest

from conftest import SIM_DIR, sim_env

PREFLIGHT = "from sglang.srt.server_args import prepare_server_args; import sys; a = prepare_server_args(sys.argv[1:]); print(repr(a))"
BASE = ["--model-path", "m", "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "d",
        "--speculative-dflash-block-size", "16"]


def run_py(code, args, version, env_extra=None, module=False):
    env = sim_env(version)
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "sglang.launch_server"] if module else [sys.executable, "-c", code]
    return subprocess.run(cmd + list(args), check=False, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("version", ["0.5.11", "0.5.12", "0.5.15", "0.5.23"])
def test_unknown_flag_exits_2(version):
    res = run_py(None, ["--model-path", "m", "--bogus", "1"], version, module=True)
    assert res.returncode == 2
    assert res.stderr.rstrip().endswith("sglang serve: error: unrecognized arguments: --bogus 1")


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_missing_model(version):
    res = run_py(None, ["--port", "1"], version, module=True)
    assert res.returncode == 2
    assert "error: the following arguments are required: --model-path/--model" in res.stderr


def test_bad_type_is_argparse_error():
    res = run_py(PREFLIGHT, ["--model-path", "m", "--tp-size", "eight"], "0.5.11")
    assert res.returncode == 2
    assert "sglang serve: error: argument --tensor-parallel-size/--tp-size: invalid int value: 'eight'" in res.stderr


@pytest.mark.parametrize("version,flag,ok,key", [
    ("0.5.11", "--speculative-dflash-draft-window-size", True, "speculative_dflash_draft_window_size"),
    ("0.5.11", "--speculative-draft-window-size", False, None),
    ("0.5.12", "--speculative-dflash-draft-window-size", True, "speculative_draft_window_size"),
    ("0.5.12", "--speculative-draft-window-size", True, "speculative_draft_window_size"),
    ("0.5.15", "--speculative-dflash-draft-window-size", True, "speculative_draft_window_size"),
    ("0.5.23", "--speculative-draft-window-size", True, "speculative_draft_window_size"),
    ("0.5.23", "--speculative-dflash-draft-window-size", False, None),
])
def test_window_flag_per_version(version, flag, ok, key):
    res = run_py(PREFLIGHT, BASE + [flag, "2048"], version)
    if ok:
        assert res.returncode == 0, res.stderr
        assert f"{key}=2048" in res.stdout
    else:
        assert res.returncode == 2
        assert f"unrecognized arguments: {flag} 2048" in res.stderr


def test_deprecation_warning_only_from_0_5_13():
    quiet = run_py(PREFLIGHT, BASE + ["--speculative-dflash-draft-window-size", "64"], "0.5.12")
    loud = run_py(PREFLIGHT, BASE + ["--speculative-dflash-draft-window-size", "64"], "0.5.15")
    assert "deprecated" not in quiet.stderr
    assert "'--speculative-dflash-draft-window-size' is deprecated" in loud.stderr


def test_real_flags_not_modelled_are_accepted():
    res = run_py(PREFLIGHT, ["--model-path", "m", "--mem-fraction-static", "0.8", "--enable-torch-compile",
                             "--chunked-prefill-size", "4096", "--trust-remote-code"], "0.5.11")
    assert res.returncode == 0, res.stderr
    assert "mem_fraction_static=0.8" in res.stdout and "enable_torch_compile=True" in res.stdout


def test_dflash_requires_draft_model():
    res = run_py(PREFLIGHT, ["--model-path", "m", "--speculative-algorithm", "DFLASH"], "0.5.11")
    assert res.returncode == 1
    assert "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path." in res.stderr


RESOLVE = PREFLIGHT + "; a.resolve_once(); print('RESOLVED')"


@pytest.mark.parametrize("version,text", [
    ("0.5.11", "ValueError: DFLASH --speculative-dflash-draft-window-size must be >= --speculative-num-draft-tokens "
               "(block_size). window_size=8, block_size=16."),
    ("0.5.23", "ValueError: --speculative-draft-window-size must be >= --speculative-num-draft-tokens "
               "(block_size). window_size=8, block_size=16."),
])
def test_window_smaller_than_block(version, text):
    flag = "--speculative-dflash-draft-window-size" if version == "0.5.11" else "--speculative-draft-window-size"
    if version == "0.5.11":  # checked by ServerArgs.__post_init__, inside prepare_server_args
        res = run_py(PREFLIGHT, BASE + [flag, "8"], version)
    else:  # 0.5.19+: prepare_server_args is argparse only; ServerArgs.resolve_once() checks
        assert run_py(PREFLIGHT, BASE + [flag, "8"], version).returncode == 0
        res = run_py(RESOLVE, BASE + [flag, "8"], version)
        assert "RESOLVED" not in res.stdout
    assert res.returncode == 1
    assert text in res.stderr


def test_prepare_server_args_in_process(monkeypatch):
    monkeypatch.setenv("SGLANG_SIM_VERSION", "0.5.11")
    sys.path.insert(0, SIM_DIR)
    try:
        from sglang.srt.server_args import prepare_server_args

        with pytest.raises(SystemExit) as info:
            prepare_server_args(["--model-path", "m", "--bogus", "1"])
        assert info.value.code == 2
        with pytest.raises(ValueError):
            prepare_server_args(["--model-path", "m", "--speculative-algorithm", "DFLASH"])
        args = prepare_server_args(BASE + ["--tp-size", "8"])
        assert args.tp_size == 8 and args.speculative_num_draft_tokens == 16
    finally:
        sys.path.remove(SIM_DIR)


@pytest.mark.parametrize("source", ["env", "file", "default"])
def test_version_selection(tmp_path, source):
    import shutil

    pkg = tmp_path / "sglang"
    shutil.copytree(os.path.join(SIM_DIR, "sglang"), pkg)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("SGLANG_SIM_VERSION", None)
    expected = "0.5.11"
    if source == "file":
        (pkg / "SIM_VERSION").write_text("0.5.23\n")
        expected = "0.5.23"
    if source == "env":
        (pkg / "SIM_VERSION").write_text("0.5.23\n")
        env["SGLANG_SIM_VERSION"] = "0.5.15"
        expected = "0.5.15"
    out = subprocess.run([sys.executable, "-c", "import sglang, sglang.version as v; print(sglang.__version__, v.__version__)"],
                         check=False, env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == [expected, expected]


def test_import_is_cheap():
    env = sim_env("0.5.11")
    code = "import sys, sglang.srt.server_args, sglang; assert 'sglang.srt.entrypoints.http_server' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], check=False, env=env, timeout=30).returncode == 0

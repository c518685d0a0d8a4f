"""Per-release CLI and validation, as read in the real wheels 0.5.10-0.5.23.

Where validation runs: ServerArgs.__post_init__ (inside prepare_server_args) up
to 0.5.18; ServerArgs.resolve_once() at launch from 0.5.19.  Texts and flag
tables are the real ones of each release.
"""
import json
import os

import pytest

from conftest import SIM_DIR, run_launch, run_python

ALL = ["0.5.%d" % n for n in range(10, 24)]
DFLASH = ["--model-path", "m", "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "d",
          "--speculative-dflash-block-size", "16"]
YELLOW = "\x1b[1;33m"
RESET = "\x1b[0m"

# prepare_server_args, then resolve_once() when the release has it; prints where it failed.
PREFLIGHT = r"""
import json, sys
from sglang.srt.server_args import prepare_server_args, ServerArgs
out = {"api": {name: hasattr(ServerArgs, name) for name in ("resolve_once", "resolved_dict", "launch_command")}}
try:
    args = prepare_server_args(sys.argv[1:])
except ValueError as exc:
    out["failed_in"], out["error"] = "prepare_server_args", str(exc)
else:
    out["raw"] = {k: getattr(args, k, "absent") for k in ("speculative_algorithm", "speculative_num_draft_tokens",
                                                          "served_model_name", "tp_size")}
    if hasattr(args, "resolve_once"):
        try:
            args.resolve_once()
        except ValueError as exc:
            out["failed_in"], out["error"] = "resolve_once", str(exc)
        else:
            resolved = args.resolved_dict()
            out["resolved"] = {k: resolved[k] for k in out["raw"]}
print("RESULT" + json.dumps(out))
"""


def preflight(args, version, **env):
    res = run_python(PREFLIGHT, args, version, **env)
    lines = [l for l in res.stdout.splitlines() if l.startswith("RESULT")]
    assert lines, (res.returncode, res.stderr[-3000:])
    return json.loads(lines[0][len("RESULT"):]), res


def window_flag(version):
    return "--speculative-dflash-draft-window-size" if version == "0.5.11" else "--speculative-draft-window-size"


@pytest.mark.parametrize("version", ALL[1:])
def test_where_the_window_check_runs(version):
    result, _res = preflight(DFLASH + [window_flag(version), "8"], version)
    late = version >= "0.5.19"
    assert result["api"] == {"resolve_once": late, "resolved_dict": late, "launch_command": version >= "0.5.20"}
    assert result["failed_in"] == ("resolve_once" if late else "prepare_server_args")
    prefix = "DFLASH " if version == "0.5.11" else ""
    assert result["error"] == (f"{prefix}{window_flag(version)} must be >= --speculative-num-draft-tokens "
                               "(block_size). window_size=8, block_size=16.")


@pytest.mark.parametrize("version,text", [
    ("0.5.11", "DFLASH requires --speculative-dflash-draft-window-size to be positive, got 0."),
    ("0.5.12", "--speculative-draft-window-size must be positive, got 0."),
    ("0.5.16", "--speculative-draft-window-size must be positive, got 0."),
    ("0.5.19", "--speculative-draft-window-size must be positive, got 0."),
    ("0.5.23", "--speculative-draft-window-size must be positive, got 0."),
])
def test_window_must_be_positive(version, text):
    result, _res = preflight(DFLASH + [window_flag(version), "0"], version)
    assert result["error"] == text


@pytest.mark.parametrize("version,fails", [("0.5.12", False), ("0.5.13", True), ("0.5.23", True)])
def test_window_checked_for_every_algorithm_from_0_5_13(version, fails):
    # 0.5.12 checks the window inside the DFLASH branch only; 0.5.13+ whatever the algorithm.
    result, _res = preflight(["--model-path", "m", "--speculative-draft-window-size", "0"], version)
    assert ("error" in result) is fails
    if fails:
        assert result["error"] == "--speculative-draft-window-size must be positive, got 0."


@pytest.mark.parametrize("version,warning", [
    ("0.5.13", "--speculative-draft-window-size has no effect with speculative_algorithm=NGRAM "
               "(honored by Llama EAGLE-3 and DFLASH only)."),
    ("0.5.23", "--speculative-draft-window-size has no effect with speculative_algorithm=NGRAM "
               "(honored by DFLASH, Llama EAGLE-3, and the EAGLE/MTP/NEXTN draft-decode path on the "
               "Triton/FlashInfer draft backends)."),
])
def test_window_without_effect_warns(version, warning):
    result, res = preflight(["--model-path", "m", "--speculative-algorithm", "NGRAM",
                             "--speculative-draft-window-size", "64"], version)
    assert "error" not in result
    assert warning in res.stderr


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13", "0.5.15", "0.5.19", "0.5.20", "0.5.23"])
def test_old_window_flag(version):
    res = run_python(PREFLIGHT, DFLASH + ["--speculative-dflash-draft-window-size", "64"], version)
    message = (f"{YELLOW}'--speculative-dflash-draft-window-size' is deprecated and will be removed in a future "
               f"release. Use '--speculative-draft-window-size' instead.{RESET}")
    if version == "0.5.12":  # a second option string of the same action: silent
        assert res.returncode == 0 and "deprecated" not in res.stderr
    elif version < "0.5.20":  # DeprecatedAliasStoreAction; no handler yet: logging's last resort, bare line
        assert res.returncode == 0, res.stderr
        assert message in res.stderr.splitlines()
    else:
        assert res.returncode == 2
        assert res.stderr.rstrip().endswith(
            "sglang serve: error: unrecognized arguments: --speculative-dflash-draft-window-size 64")


@pytest.mark.parametrize("version,failed_in", [
    ("0.5.12", "prepare_server_args"), ("0.5.18", "prepare_server_args"),
    ("0.5.19", "resolve_once"), ("0.5.23", "resolve_once"),
])
def test_unknown_algorithm_fails_after_parsing(version, failed_in):
    result, res = preflight(["--model-path", "m", "--speculative-algorithm", "bogus"], version)
    assert res.returncode == 0
    assert result["failed_in"] == failed_in
    assert result["error"] == "Unknown speculative algorithm name: BOGUS"  # upper-cased before the lookup


def test_unknown_algorithm_is_an_argparse_choice_error_in_0_5_11():
    res = run_python(PREFLIGHT, ["--model-path", "m", "--speculative-algorithm", "BOGUS"], "0.5.11")
    assert res.returncode == 2
    assert ("sglang serve: error: argument --speculative-algorithm: invalid choice: 'BOGUS' (choose from "
            "'DFLASH', 'EAGLE', 'EAGLE3', 'NEXTN', 'STANDALONE', 'NGRAM')") in res.stderr


@pytest.mark.parametrize("version,name,known", [
    ("0.5.12", "FROZEN_KV_MTP", True), ("0.5.15", "DSPARK", False), ("0.5.16", "DSPARK", True),
    ("0.5.19", "UNO", False), ("0.5.20", "UNO", True), ("0.5.23", "DDTREE", False),
])
def test_algorithms_per_release(version, name, known):
    result, _res = preflight(["--model-path", "m", "--speculative-algorithm", name], version)
    assert ("error" not in result) is known, result


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_algorithm_names_are_upper_cased_and_nextn_is_eagle(version):
    result, _res = preflight(DFLASH[:2] + ["--speculative-algorithm", "nextn"], version)
    resolved = result.get("resolved") or result["raw"]
    assert resolved["speculative_algorithm"] == "EAGLE"
    result, _res = preflight(["--model-path", "m", "--speculative-algorithm", "dflash",
                              "--speculative-draft-model-path", "d", "--speculative-dflash-block-size", "8"],
                             version)
    resolved = result.get("resolved") or result["raw"]
    assert resolved["speculative_algorithm"] == "DFLASH" and resolved["speculative_num_draft_tokens"] == 8


def test_ddtree_only_in_a_private_build():
    budget = ["--model-path", "m", "--speculative-ddtree-tree-budget", "32"]
    assert run_python(PREFLIGHT, budget, "0.5.23").returncode == 2  # no public release has the flag
    result, _res = preflight(["--model-path", "m", "--speculative-algorithm", "DDTREE",
                              "--speculative-draft-model-path", "d"] + budget[2:], "0.5.23", SGLANG_SIM_DDTREE="1")
    assert "error" not in result and result["resolved"]["speculative_num_draft_tokens"] == 16


def test_raw_fields_and_resolved_values_from_0_5_19():
    result, _res = preflight(DFLASH + ["--tp-size", "8"], "0.5.23")
    assert result["raw"] == {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": None,
                             "served_model_name": None, "tp_size": 8}
    assert result["resolved"] == {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16,
                                  "served_model_name": "m", "tp_size": 8}
    result, _res = preflight(DFLASH + ["--tp-size", "8"], "0.5.18")  # __post_init__ resolved the fields
    assert result["raw"]["speculative_num_draft_tokens"] == 16 and result["raw"]["served_model_name"] == "m"


def test_failed_resolution_cannot_be_retried():
    code = ("from sglang.srt.server_args import prepare_server_args\nimport sys\n"
            "a = prepare_server_args(sys.argv[1:])\n"
            "for _ in range(2):\n"
            "    try:\n        a.resolve_once()\n    except Exception as e:\n        print(type(e).__name__ + ': ' + str(e))\n")
    res = run_python(code, DFLASH + ["--speculative-draft-window-size", "8"], "0.5.23")
    first, second = res.stdout.splitlines()
    assert first.startswith("ValueError: ") and second.startswith(
        "RuntimeError: resolution already failed on this ServerArgs")


@pytest.mark.parametrize("version,args,text", [
    ("0.5.15", ["--dp-size", "2", "--enable-dp-attention"],
     "Currently DFLASH speculative decoding does not support dp attention."),
    ("0.5.21", ["--dp-size", "2", "--enable-dp-attention"],
     "Currently DFLASH speculative decoding does not support dp attention on non-NPU devices."),
    ("0.5.23", ["--attn-dp-size", "2", "--tp-size", "2"], "DFLASH with dp attention requires --enable-dp-lm-head."),
    ("0.5.23", ["--dp-size", "2", "--enable-dp-attention", "--tp-size", "2"],
     "DFLASH with dp attention requires --enable-dp-lm-head."),
    ("0.5.16", ["--device", "cpu"], "DFLASH speculative decoding only supports CUDA device."),
    ("0.5.18", ["--device", "cpu"], "DFLASH speculative decoding only supports CUDA and NPU devices."),
    ("0.5.20", ["--device", "cpu"], "DFLASH speculative decoding only supports CUDA, NPU and XPU devices."),
    ("0.5.23", ["--device", "cpu"],
     "DFLASH speculative decoding is not supported by CudaSRTPlatform on device 'cpu'."),
    ("0.5.11", ["--pp-size", "2"], "Currently DFLASH speculative decoding only supports pp_size == 1."),
])
def test_other_dflash_checks(version, args, text):
    result, _res = preflight(DFLASH + args, version)
    assert result["error"] == text


@pytest.mark.parametrize("version,flag,accepted", [
    ("0.5.11", "--detokenizer-worker-num", False), ("0.5.12", "--detokenizer-worker-num", True),
    ("0.5.12", "--enable-nan-detection", True), ("0.5.13", "--enable-nan-detection", False),
    ("0.5.19", "--uno-lora-path", False), ("0.5.20", "--uno-lora-path", True),
    ("0.5.21", "--attn-dp-size", False), ("0.5.22", "--attn-dp-size", True),
])
def test_each_release_has_its_own_flag_table(version, flag, accepted):
    value = [] if flag == "--enable-nan-detection" else ["1" if "num" in flag or "size" in flag else "x"]
    res = run_python(PREFLIGHT, ["--model-path", "m", flag, *value], version)
    assert (res.returncode == 0) is accepted, res.stderr[-500:]
    if not accepted:
        assert "unrecognized arguments: " + flag in res.stderr


def test_profiles_are_the_dumped_releases():
    profiles = os.path.join(SIM_DIR, "sglang", "srt", "profiles")
    tables = {}
    for version in ALL:
        with open(os.path.join(profiles, version + ".json"), encoding="utf-8") as handle:
            doc = json.load(handle)
        assert doc["version"] == version
        tables[version] = {flag for spec in doc["flags"] for flag in spec["flags"]}
        assert doc["fields"][0]["name"] == "model_path"
    new_in_12 = tables["0.5.12"] - tables["0.5.11"]
    assert "--speculative-draft-window-size" in new_in_12 and len(new_in_12) == 15
    assert "--speculative-dflash-draft-window-size" not in tables["0.5.20"]
    with open(os.path.join(profiles, "0.5.23.json"), encoding="utf-8") as handle:
        assert len(json.load(handle)["fields"]) == 546


@pytest.mark.parametrize("version,stage", [("0.5.15", "prepare"), ("0.5.23", "resolve")])
def test_launch_fails_with_the_real_message(version, stage):
    res = run_launch(DFLASH + ["--speculative-draft-window-size", "8", "--port", "1"], version)
    assert res.returncode == 1
    lines = res.stderr.rstrip().splitlines()
    assert lines[-1] == ("ValueError: --speculative-draft-window-size must be >= --speculative-num-draft-tokens "
                         "(block_size). window_size=8, block_size=16.")
    assert "Traceback (most recent call last):" in res.stderr
    assert ("in prepare_server_args" in res.stderr) is (stage == "prepare")
    assert ("in resolve_once" in res.stderr) is (stage == "resolve")
    assert "server_args=" not in res.stderr and "Load weight begin" not in res.stderr


def test_launch_unknown_algorithm_fails_at_resolution():
    res = run_launch(["--model-path", "m", "--speculative-algorithm", "DDTREE", "--port", "1"], "0.5.23")
    assert res.returncode == 1
    assert res.stderr.rstrip().splitlines()[-1] == "ValueError: Unknown speculative algorithm name: DDTREE"


def test_api_is_the_release_s(monkeypatch):
    # in-process: hasattr() answers per release (selected at call time here)
    monkeypatch.syspath_prepend(SIM_DIR)
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setenv("SGLANG_SIM_VERSION", "0.5.18")
    assert not hasattr(ServerArgs, "resolve_once")
    monkeypatch.setenv("SGLANG_SIM_VERSION", "0.5.19")
    assert hasattr(ServerArgs, "resolve_once") and not hasattr(ServerArgs, "launch_command")
    record = ServerArgs(model_path="m")
    assert record.served_model_name is None  # construction leaves the record raw
    record.resolve_once()
    assert record.resolved_dict()["served_model_name"] == "m"
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        ServerArgs(model_path="m", bogus=1)
    monkeypatch.setenv("SGLANG_SIM_VERSION", "0.5.11")
    assert ServerArgs(model_path="m").served_model_name == "m"  # __post_init__ resolves

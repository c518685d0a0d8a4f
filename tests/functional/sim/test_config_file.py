"""--config FILE.yaml: merged into argv in-process, as the real ConfigArgumentMerger does.

Every case here was also run through the real merger and parser of the wheels
(0.5.11-0.5.23, imports stubbed) while writing the simulator; the expected
values are what the real code produced.
"""
import json
import os
import signal

import pytest

from conftest import SIM_DIR, run_python

MERGE = r"""
import json, sys
from sglang.srt.server_args import build_parser
from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
parser = build_parser()
argv = sys.argv[1:]
try:
    merged = ConfigArgumentMerger(parser).merge_config_with_args(argv) if "--config" in argv else argv
except ValueError as exc:
    print("RESULT" + json.dumps({"error": str(exc)}))
    raise SystemExit(0)
ns = vars(parser.parse_args(merged))
print("RESULT" + json.dumps({"argv": merged, "ns": ns}, default=str))
"""


def merge(tmp_path, text, args=(), version="0.5.23"):
    """Merge and parse ``args`` (plus ``--config <file with text>`` when text is given)."""
    args = list(args)
    if text is not None:
        path = tmp_path / "sglang.yaml"
        path.write_text(text)
        args += ["--config", str(path)]
    res = run_python(MERGE, args, version)
    lines = [l for l in res.stdout.splitlines() if l.startswith("RESULT")]
    if not lines:
        return {"exit": res.returncode, "stderr": res.stderr}
    return json.loads(lines[0][len("RESULT"):])


@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.15", "0.5.19", "0.5.23"])
def test_file_options_come_first_so_the_command_line_wins(tmp_path, version):
    out = merge(tmp_path, "model-path: /models/k2\nport: 30001\napi-key: sekret\n", ["--port", "40000"], version)
    assert out["argv"] == ["--model-path", "/models/k2", "--port", "30001", "--api-key", "sekret", "--port", "40000"]
    assert out["ns"]["port"] == 40000 and out["ns"]["api_key"] == "sekret"


def test_yaml_types_become_strings_as_pyyaml_reads_them(tmp_path):
    # YAML 1.1 as PyYAML's safe_load: yes -> True -> "true"; 0755 -> 493; a quoted value stays as written
    out = merge(tmp_path, "model-path: m\napi-key: yes\nserved-model-name: 0755\nhost: '0755'\n")
    assert out["argv"] == ["--model-path", "m", "--api-key", "true", "--served-model-name", "493",
                           "--host", "0755"]


def test_store_true_keys(tmp_path):
    out = merge(tmp_path, "model-path: m\nenable-metrics: true\ntrust-remote-code: false\n",
                ["--trust-remote-code"])
    assert out["argv"] == ["--model-path", "m", "--enable-metrics", "--trust-remote-code"]
    assert out["ns"]["enable_metrics"] is True
    assert out["ns"]["trust_remote_code"] is True  # false in the file cannot turn a command-line flag off


@pytest.mark.parametrize("version,flag", [("0.5.11", "cuda-graph-bs"), ("0.5.23", "cuda-graph-bs-decode")])
def test_lists_pass_their_items(tmp_path, version, flag):
    out = merge(tmp_path, f"model-path: m\n{flag}: [1, 2, 4]\nnuma-node: []\n", version=version)
    assert out["argv"] == ["--model-path", "m", f"--{flag}", "1", "2", "4"]
    assert out["ns"][flag.replace("-", "_")] == [1, 2, 4]


@pytest.mark.parametrize("version,passed", [
    ("0.5.13", "{'type': 'yarn'}"),  # str(dict)
    ("0.5.14", '{"type": "yarn"}'),  # json.dumps
])
def test_mappings(tmp_path, version, passed):
    out = merge(tmp_path, "model-path: m\njson-model-override-args:\n  type: yarn\n", version=version)
    assert out["argv"][-2:] == ["--json-model-override-args", passed]


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_keys_are_spelled_like_the_flag(tmp_path, version):
    out = merge(tmp_path, "model-path: m\napi_key: sekret\n", version=version)
    assert out["exit"] == 2  # --api_key is no option; argparse prints the value it did not recognise
    assert "sglang serve: error: unrecognized arguments: --api_key sekret" in out["stderr"]


@pytest.mark.parametrize("version,error", [
    ("0.5.12", None),
    ("0.5.13", "Unsupported config option 'speculative_draft_window_size' with action "
               "'DeprecatedAliasStoreAction'"),
    ("0.5.19", "Unsupported config option 'speculative_draft_window_size' with action "
               "'DeprecatedAliasStoreAction'"),
    ("0.5.20", None),
    ("0.5.23", None),
])
def test_window_key_in_a_file(tmp_path, version, error):
    # 0.5.13-0.5.19: the deprecated alias shares the dest, and the merger keys actions by dest
    out = merge(tmp_path, "model-path: m\nspeculative-draft-window-size: 2048\n", version=version)
    if error:
        assert out == {"error": error}
    else:
        assert out["ns"]["speculative_draft_window_size"] == 2048


def test_unsupported_actions(tmp_path):
    assert merge(tmp_path, "model-path: m\nlora-paths: [a, b]\n") == {
        "error": "Unsupported config option 'lora_paths' with action 'LoRAPathAction'"}


@pytest.mark.parametrize("args,text,error", [
    (["--config", "{p}", "--config", "{p}"], "model-path: m\n", "Multiple config files specified! Only one allowed."),
    (["--model-path", "m", "--config"], None, "No config file specified after --config flag!"),
    (["--config", "{d}/x.json"], None, "Config file must be YAML format, got: .json"),
    (["--config", "{d}/missing.yml"], None, "Config file not found: {d}/missing.yml"),
    (["--config", "{p}"], "- a\n- b\n", "Config file must contain a dictionary at root level"),
])
def test_errors(tmp_path, args, text, error):
    path = tmp_path / "given.yaml"
    if text is not None:
        path.write_text(text)
    args = [a.format(p=path, d=tmp_path) for a in args]
    out = merge(tmp_path, None, args)
    assert out == {"error": error.format(d=tmp_path)}


def test_equals_form_is_parsed_and_ignored(tmp_path):
    (tmp_path / "sglang.yaml").write_text("api-key: sekret\n")
    out = merge(tmp_path, None, ["--model-path", "m", f"--config={tmp_path / 'sglang.yaml'}"])
    assert out["ns"]["api_key"] is None and out["ns"]["config"].endswith("sglang.yaml")


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_api_key_from_a_file_keeps_it_out_of_the_process_list(tmp_path, start_sim, version):
    config = tmp_path / "sglang.yaml"
    config.write_text("api-key: s3cr3t-key\nenable-metrics: true\n")
    os.chmod(config, 0o600)
    window = "--speculative-dflash-draft-window-size" if version == "0.5.11" else "--speculative-draft-window-size"
    sim = start_sim([window, "2048", "--config", str(config)], version=version).wait_ready()
    with open(f"/proc/{sim.proc.pid}/cmdline", "rb") as handle:
        cmdline = handle.read().split(b"\0")
    assert b"s3cr3t-key" not in b" ".join(cmdline) and str(config).encode() in cmdline
    assert sim.get("/v1/models")[0] == 401
    assert sim.get("/v1/models", headers={"Authorization": "Bearer s3cr3t-key"})[0] == 200
    assert sim.get("/metrics")[0] == 200  # enable-metrics came from the file too
    info = json.loads(sim.get("/server_info", headers={"Authorization": "Bearer s3cr3t-key"})[2])
    # What SGLang itself still shows: /server_info has the key; 0.5.20+ launch_command is the merged argv.
    assert info["api_key"] == "s3cr3t-key"
    if version == "0.5.23":
        assert info["launch_command"].startswith("--api-key s3cr3t-key --enable-metrics --model-path")
    sim.proc.send_signal(signal.SIGTERM)
    sim.wait_exit()
    config_line = [l for l in sim.output().splitlines() if "server_args=" in l][0]
    assert "s3cr3t-key" in config_line  # and the first log line, in clear text


def test_yaml_reader_matches_pyyaml():
    yaml = pytest.importorskip("yaml")
    import sys

    sys.path.insert(0, SIM_DIR)
    try:
        from sglang._sim_yaml import safe_load
    finally:
        sys.path.remove(SIM_DIR)
    documents = [
        "api-key: sekret\nport: 30000\n",
        "# comment\n---\nmodel-path: /models/kimi-k2.6   # trailing\ntp-size: 8\nenable-metrics: true\n",
        "a: yes\nb: On\nc: off\nd: ~\ne: null\nf:\ng: 0755\nh: 0x1F\ni: 1_000\nj: 1e3\nk: 1.5e+3\nl: .inf\n"
        "n: 1.0\no: '1.0'\np: \"x\\ty\"\nq: 'it''s'\nr: 3:25\ns: -12\nt: +7\nu: 0b101\nv: 0.\n",
        "list:\n  - a\n  - 2\n  - true\nflow: [1, two, 'three', \"four\"]\nempty: []\n",
        "list:\n- a\n- b\nnext: 1\n",
        "nested:\n  a: 1\n  b:\n    c: [x, y]\n    d: {e: 1, f: 'g'}\nz: 'end'\n",
        "url: http://host:8080/x\nkey: a#b\nkey2: a #comment\npath: /a/b c\n",
        "json-model-override-args: '{\"rope_scaling\": {\"type\": \"yarn\"}}'\n",
        "'quoted key': 1\n\"other\": 2\n",
        "x: \"a: b\"\ny: [a, [b, c], {d: e}]\nz: -1.5\nw: .5\n",
        "", "# only a comment\n",
    ]
    for text in documents:
        assert safe_load(text) == yaml.safe_load(text), text


@pytest.mark.parametrize("text", ["x: |\n  block\n", "x: &a 1\ny: *a\n", "x: !!str 1\n", "x: 2001-12-14\n",
                                  "x:\n  - a: 1\n", "x: 'unterminated\n"])
def test_yaml_reader_refuses_what_it_does_not_read_like_pyyaml(text):
    import sys

    sys.path.insert(0, SIM_DIR)
    try:
        from sglang._sim_yaml import YAMLError, safe_load
    finally:
        sys.path.remove(SIM_DIR)
    with pytest.raises(YAMLError):
        safe_load(text)


def test_unreadable_yaml_fails_the_launch_like_a_bad_file(tmp_path):
    (tmp_path / "sglang.yaml").write_text("api-key: |\n  sekret\n")
    res = run_python("from sglang.srt.server_args import prepare_server_args; import sys; "
                     "prepare_server_args(sys.argv[1:])",
                     ["--model-path", "m", "--config", str(tmp_path / "sglang.yaml")], "0.5.23")
    assert res.returncode == 1
    assert f"Failed to read config file {tmp_path / 'sglang.yaml'}: line 1:" in res.stderr

# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a running process really is (/proc), compared with the intent; secrets never leave."""
import json
import re

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _process as proc

from fakes import COMMAND, FakeProc

KEY = "s3cr3t-KEY"
MASK = proc.MASK


# --------------------------------------------------------------------------- redact (argv)

def test_redact_masks_secret_flag_values_in_both_forms():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", KEY, "--admin-api-key=" + KEY, "--hf-token", KEY,
            "--some-secret", KEY, "--db-password=" + KEY, "--API-KEY", KEY]
    masked = proc.redact(argv)
    assert KEY not in " ".join(masked)
    assert masked == ["python", "-m", "sglang.launch_server", "--api-key", MASK, "--admin-api-key=" + MASK,
                      "--hf-token", MASK, "--some-secret", MASK, "--db-password=" + MASK, "--API-KEY", MASK]
    assert argv[4] == KEY  # the input is not changed


def test_redact_keeps_lookalikes():
    argv = ["--speculative-num-draft-tokens", "16", "--max-prefill-tokens", "8192", "--tokenizer-path", "/t",
            "--keyfile", "/k", "--ssl-keyfile", "/etc/ssl/k.pem", "--key-value", "x"]
    assert proc.redact(argv) == argv


def test_redact_edge_cases():
    assert proc.redact(None) == [] and proc.redact([]) == []
    assert proc.redact(["--api-key"]) == ["--api-key"]  # no value to mask
    assert proc.redact(["api-key", KEY]) == ["api-key", KEY]  # not a flag
    # the value after a secret flag is masked even when it looks like a flag
    assert proc.redact(["--api-key", "--port"]) == ["--api-key", MASK]


# --------------------------------------------------------------------------- redact_text (log lines)

SERVER_ARGS = ("[2026-11-29 10:00:00] server_args=ServerArgs(model_path='/m', tokenizer_path='/m', api_key=%r, "
               "admin_api_key=None, speculative_num_draft_tokens=16, max_prefill_tokens=16384)")


@pytest.mark.parametrize("key", [KEY, "it's", 'say "hi"', "ab'cd\"ef", "back\\slash'", "a b", "x=y, z='w'"])
def test_server_args_repr_never_leaks_the_key(key):
    line = SERVER_ARGS % key
    masked = proc.redact_text(line)
    # the whole quoted value, escaped quotes included, became the mask: nothing of the key is left
    assert re.search(r"""tokenizer_path='/m', api_key=(['"])\*{8}\1, admin_api_key=None""", masked), masked
    # what is not a secret stays readable
    assert "tokenizer_path='/m'" in masked and "speculative_num_draft_tokens=16" in masked
    assert "admin_api_key=None" in masked and "max_prefill_tokens=16384" in masked


def test_dict_form_never_leaks_the_key():
    for key in (KEY, 'a"b', "a\\b"):
        text = json.dumps({"api_key": key, "model_path": "/m", "speculative_num_draft_tokens": 16})
        masked = proc.redact_text(text)
        assert key not in masked and '"model_path": "/m"' in masked and '"api_key": "%s"' % MASK in masked
    assert proc.redact_text("{'api_key': '%s', 'x': 1}" % KEY) == "{'api_key': '%s', 'x': 1}" % MASK


@pytest.mark.parametrize("text,masked", [
    ("launch --api-key %s --port 1" % KEY, "launch --api-key %s --port 1" % MASK),
    ("launch --api-key=%s --port 1" % KEY, "launch --api-key=%s --port 1" % MASK),
    ("error: unrecognized arguments: --admin-api-key %s" % KEY,
     "error: unrecognized arguments: --admin-api-key %s" % MASK),
    ("--speculative-num-draft-tokens 16 --tokenizer-path /t", "--speculative-num-draft-tokens 16 --tokenizer-path /t"),
    ("tokenizer_path='/models/k'", "tokenizer_path='/models/k'"),
    ("api_key=None", "api_key=None"),
    ("api_key=''", "api_key=''"),
    ("", ""),
])
def test_redact_text_command_lines(text, masked):
    assert proc.redact_text(text) == masked


def test_redact_text_of_none():
    assert proc.redact_text(None) is None


# --------------------------------------------------------------------------- split / compare command

def test_split_command():
    prefix, flags = proc.split_command(["/py", "-m", "sglang.launch_server", "--a", "1", "--b=2", "--c", "--d", "x",
                                        "y", "--", "z"])
    assert prefix == ["/py", "-m", "sglang.launch_server"]
    assert flags == [("--a", ["1"]), ("--b", ["2"]), ("--c", []), ("--d", ["x", "y", "--", "z"])]
    assert proc.split_command(None) == ([], [])


def test_compare_command_is_order_insensitive():
    shuffled = COMMAND[:3] + COMMAND[7:] + COMMAND[3:7]
    assert proc.compare_command(COMMAND, shuffled) == []
    assert proc.compare_command(COMMAND, list(COMMAND)) == []


def test_equals_form_and_separate_form_are_the_same_flag():
    assert proc.compare_command(["p", "--port", "1"], ["p", "--port=1"]) == []


def test_compare_command_is_value_sensitive():
    running = [arg if arg != "2048" else "512" for arg in COMMAND]
    assert proc.compare_command(COMMAND, running) == [
        {"key": "--speculative-dflash-draft-window-size", "expected": "2048", "observed": "512"}]


def test_compare_command_is_repetition_sensitive():
    repeated = COMMAND + ["--speculative-num-draft-tokens", "16"]
    assert proc.compare_command(COMMAND, repeated) == [
        {"key": "--speculative-num-draft-tokens", "expected": "16", "observed": ["16", "16"]}]


def test_compare_command_names_missing_extra_and_bare_flags_and_the_program():
    intended = ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--enable-metrics", "--port", "1"]
    running = ["/usr/bin/python3", "-m", "sglang.launch_server", "--port", "1", "--log-level", "debug"]
    assert proc.compare_command(intended, running) == [
        {"key": "program", "expected": "/opt/sglang/venv/bin/python -m sglang.launch_server",
         "observed": "/usr/bin/python3 -m sglang.launch_server"},
        {"key": "--enable-metrics", "expected": "(set)", "observed": None},
        {"key": "--log-level", "expected": None, "observed": "debug"},
    ]


def test_compare_command_masks_secret_values_in_its_differences():
    intended = ["p", "--api-key", "old-" + KEY]
    running = ["p", "--api-key", "new-" + KEY]
    assert proc.compare_command(intended, running) == []  # both masked: a key change is not shown or compared
    differences = proc.compare_command(["p"], ["p", "--api-key=" + KEY])
    assert differences == [{"key": "--api-key", "expected": None, "observed": MASK}]
    assert KEY not in json.dumps(differences)


def test_compare_command_with_multi_value_flags():
    assert proc.compare_command(["p", "--cuda-graph-bs", "1", "2"], ["p", "--cuda-graph-bs", "2", "1"]) == [
        {"key": "--cuda-graph-bs", "expected": "1 2", "observed": "2 1"}]


# --------------------------------------------------------------------------- environment

def test_compare_environment():
    assert proc.compare_environment({"A": "1"}, {"A": "1"}) == []
    assert proc.compare_environment({"A": "1", "B": "2"}, {"A": "3", "C": "4"}) == [
        {"key": "A", "expected": "1", "observed": "3"},
        {"key": "B", "expected": "2", "observed": None},
        {"key": "C", "expected": None, "observed": "4"},
    ]
    assert proc.compare_environment(None, None) == []
    assert proc.compare_environment({"A": ""}, {}) == [{"key": "A", "expected": "", "observed": None}]


# --------------------------------------------------------------------------- /proc

def test_process_state_and_alive(tmp_path):
    fake = FakeProc(tmp_path)
    fake.process(10, state="S").process(11, state="Z").process(12, state="R", comm="a) b (c").process(13, state="X")
    assert proc.process_state(10, fake.root) == "S" and proc.process_alive(10, fake.root)
    assert proc.process_state(11, fake.root) == "Z" and not proc.process_alive(11, fake.root)
    assert proc.process_state(12, fake.root) == "R" and proc.process_alive(12, fake.root)  # comm with ")"
    assert not proc.process_alive(13, fake.root)
    assert proc.process_state(99, fake.root) is None and not proc.process_alive(99, fake.root)
    assert proc.process_state(0, fake.root) is None and proc.process_state(None, fake.root) is None


def test_alive_is_judged_by_stat_not_by_the_command_line(tmp_path):
    fake = FakeProc(tmp_path).process(20, state="S", cmdline=b"")  # inside exec: empty cmdline
    assert proc.process_alive(20, fake.root)
    assert proc.read_cmdline(20, fake.root) is None


def test_read_cmdline(tmp_path):
    fake = FakeProc(tmp_path).process(30, cmdline=COMMAND + ["caf\xe9", ""])
    assert proc.read_cmdline(30, fake.root) == COMMAND + ["caf\xe9"]  # trailing empty arguments are cut
    assert proc.read_cmdline(31, fake.root) is None  # gone
    (tmp_path / "proc" / "32").mkdir()
    (tmp_path / "proc" / "32" / "cmdline").write_bytes(b"/bin/x\0-a\0\xff\0")
    assert proc.read_cmdline(32, fake.root) == ["/bin/x", "-a", u"\ufffd"]


def test_read_environ_returns_only_the_keys_asked_for(tmp_path):
    fake = FakeProc(tmp_path).process(40, environ={"A": "1", "SGLANG_API_KEY": KEY, "B": "x=y", "EMPTY": ""})
    assert proc.read_environ(40, ["A", "B", "EMPTY", "MISSING"], fake.root) == {"A": "1", "B": "x=y", "EMPTY": ""}
    assert KEY not in json.dumps(proc.read_environ(40, ["A"], fake.root))
    assert proc.read_environ(41, ["A"], fake.root) is None
    (tmp_path / "proc" / "42").mkdir()
    (tmp_path / "proc" / "42" / "environ").write_bytes(b"")  # a kernel thread / zombie: empty, not unknown
    assert proc.read_environ(42, ["A"], fake.root) == {}


def test_process_start_time(tmp_path, monkeypatch):
    monkeypatch.setattr(proc.os, "sysconf", lambda name: 100)
    fake = FakeProc(tmp_path, btime=1764410000).process(50, start_ticks=12345)
    assert proc.process_start_time(50, fake.root) == 1764410000 + 123.45
    assert proc.process_start_time(51, fake.root) is None
    (tmp_path / "proc" / "stat").write_text("cpu 1 2\n")  # no btime line
    assert proc.process_start_time(50, fake.root) is None
    (tmp_path / "proc" / "stat").write_text("btime 1\n")
    (tmp_path / "proc" / "50" / "stat").write_text("50 (x) S 1\n")  # truncated
    assert proc.process_start_time(50, fake.root) is None


def test_process_start_time_is_not_truncated_to_btime_seconds(tmp_path, monkeypatch):
    """The machine booted at .90 of a second: btime says the whole second before. A process started
    0.2 s after a file was written must read as started after it, not 0.7 s before."""
    monkeypatch.setattr(proc.os, "sysconf", lambda name: 100)
    booted = 1764410000.90
    now = booted + 5000.0
    monkeypatch.setattr(proc.time, "time", lambda: now)
    fake = FakeProc(tmp_path, btime=1764410000).process(50, start_ticks=12345)
    (tmp_path / "proc" / "uptime").write_text("%.2f 9000.00\n" % (now - booted))
    assert proc.boot_epoch(fake.root) == pytest.approx(booted, abs=0.01)
    assert proc.process_start_time(50, fake.root) == pytest.approx(booted + 123.45, abs=0.01)
    written = booted + 123.45 - 0.2
    assert proc.process_start_time(50, fake.root) > written  # with btime alone: 1764410123.45 < written


@pytest.mark.parametrize("uptime", ["", "garbage 1\n", "%.2f 1.00\n" % (5000.0 - 3 * 3600)])
def test_boot_epoch_falls_back_to_btime(tmp_path, monkeypatch, uptime):
    """No uptime, an unreadable one, or one that disagrees with btime (a container's own uptime,
    3 h shorter than the machine's): btime."""
    monkeypatch.setattr(proc.time, "time", lambda: 1764410000.9 + 5000.0)
    fake = FakeProc(tmp_path, btime=1764410000)
    if uptime:
        (tmp_path / "proc" / "uptime").write_text(uptime)
    assert proc.boot_epoch(fake.root) == 1764410000.0


def test_boot_epoch_without_btime_is_unknown(tmp_path):
    FakeProc(tmp_path)
    (tmp_path / "proc" / "stat").write_text("cpu 1 2\n")
    (tmp_path / "proc" / "uptime").write_text("5000.00 1.00\n")
    assert proc.boot_epoch(str(tmp_path)) is None


def test_boot_epoch_of_this_machine_is_within_a_second_of_btime():
    with open("/proc/stat") as handle:
        btime = int(next(line.split()[1] for line in handle if line.startswith("btime ")))
    assert btime - 0.05 <= proc.boot_epoch() < btime + 1.05


SGLANG = ["-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "8"]


def test_a_launcher_that_execs_the_interpreter_differs_only_in_the_program():
    found, notes = proc.command_differences(["/opt/venv/bin/python"] + SGLANG, ["/usr/bin/python3.11"] + SGLANG)
    assert found == []
    assert notes == ["its program is /usr/bin/python3.11 where the unit says /opt/venv/bin/python (a launcher in "
                     "front of the interpreter that execs it); the module and every argument agree"]


def test_interpreter_options_in_front_of_the_module_are_part_of_the_program():
    found, notes = proc.command_differences(["/opt/venv/bin/python"] + SGLANG,
                                            ["/usr/bin/python3.11", "-X", "faulthandler"] + SGLANG)
    assert found == [] and "/usr/bin/python3.11 -X faulthandler" in notes[0]


def test_other_arguments_are_differences_and_then_the_program_is_named_too():
    running = ["/usr/bin/python3.11"] + SGLANG[:-1] + ["4"]
    found, notes = proc.command_differences(["/opt/venv/bin/python"] + SGLANG, running)
    assert notes == []
    assert found == [{"key": "program", "expected": "/opt/venv/bin/python", "observed": "/usr/bin/python3.11"},
                     {"key": "--tp-size", "expected": "8", "observed": "4"}]


def test_another_module_is_a_difference():
    found, notes = proc.command_differences(["/py"] + SGLANG, ["/py", "-m", "other.server"] + SGLANG[2:])
    assert found == [{"key": "module", "expected": "-m sglang.launch_server", "observed": "-m other.server"}]


def test_equal_command_lines_and_the_console_script_form():
    assert proc.command_differences(["/py"] + SGLANG, ["/py"] + SGLANG) == ([], [])
    # `sglang serve` has no -m: SGLang's part starts after the program
    found, notes = proc.command_differences(["/opt/venv/bin/sglang", "serve", "--port", "1"],
                                            ["/usr/local/bin/sglang", "serve", "--port", "1"])
    assert found == [] and notes

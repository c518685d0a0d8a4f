# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A unit file rebuilt from what its process runs (the lost-handler case of a last-known-good copy)."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import _unquote_words, parse_environment
from ansible_collections.gpufleet.inference.plugins.module_utils._unit_file import parse_environ, rebuild_from_process

INSTALLED = """# Ansible managed
[Unit]
Description=SGLang server kimi
Environment=NOT_IN_SERVICE=1

[Service]
Type=simple
Environment="SGLANG_SIM_FAULT=ignore_window"
Environment="SGLANG_SIM_LOAD_SECONDS=2"
EnvironmentFile=-/etc/default/sglang
ExecStart="/opt/sglang/venv/bin/python" \\
    "-m" \\
    "sglang.launch_server" \\
    "--speculative-dflash-draft-window-size" \\
    "4096"
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


def service_lines(text):
    """The [Service] lines, continuation lines joined."""
    section, out = None, []
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            out.append(line)
    return out


def test_execstart_and_environment_become_the_processes():
    argv = ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--speculative-dflash-draft-window-size",
            "1024", "--served-model-name", "kimi 100% $HOME"]
    text = rebuild_from_process(INSTALLED, argv, {"SGLANG_SIM_LOAD_SECONDS": "2", "OLD_ONLY": "1"})
    lines = service_lines(text)
    execs = [line for line in lines if line.startswith("ExecStart=")]
    assert len(execs) == 1
    assert _unquote_words(execs[0][len("ExecStart="):].replace("%%", "%").replace("$$", "$")) == argv
    envs = [line[len("Environment="):] for line in lines if line.startswith("Environment=")]
    assert parse_environment(" ".join(envs)) == {"OLD_ONLY": "1", "SGLANG_SIM_LOAD_SECONDS": "2"}
    assert not any(line.startswith("EnvironmentFile=") for line in lines)
    assert "4096" not in text and "ignore_window" not in text
    # everything else is kept, in place
    assert "Type=simple" in lines and "Restart=on-failure" in lines
    assert "Environment=NOT_IN_SERVICE=1" in text  # not in [Service]: not touched
    assert text.index("[Install]") > text.index("ExecStart=")
    assert "%%" in execs[0] and "$$HOME" in execs[0]


def test_a_unit_without_a_service_section_gets_one():
    text = rebuild_from_process("[Unit]\nDescription=x\n", ["/bin/sleep", "60"], {})
    assert text.endswith('[Service]\nExecStart="/bin/sleep" \\\n    "60"\n')


def test_nothing_to_rebuild_and_unwritable_values_raise():
    with pytest.raises(ValueError, match="no command line"):
        rebuild_from_process(INSTALLED, [], {})
    with pytest.raises(ValueError):
        rebuild_from_process(INSTALLED, ["/bin/sleep"], {"BAD": "line\nbreak"})


def test_what_systemd_sets_by_itself_is_left_out():
    raw = (b"INVOCATION_ID=abc\0JOURNAL_STREAM=8:9\0SYSTEMD_EXEC_PID=7\0A=1=2\0noequals\0B=\0"
           b"PATH=/usr/bin\0HOME=/root\0LANG=C.UTF-8\0LC_ALL=C\0USER=root\0")
    assert parse_environ(raw) == {"A": "1=2", "B": ""}
    assert parse_environ(None) == {}

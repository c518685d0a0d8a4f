# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.inference.linear in a real ansible-playbook, and the playbooks' choice of strategy.

More hosts than forks: every task queues hosts while all workers are busy (the path the strategy
changes); the play must run every host, in lockstep, exactly as ansible.builtin.linear does."""
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["h%d" % n for n in range(1, 7)]


def playbook(tmp_path, argv, extra_env=None):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORKS="2", ANSIBLE_HOST_KEY_CHECKING="0")
    env.pop("ANSIBLE_CONFIG", None)  # cwd is tmp_path: no ansible.cfg of the checkout
    env.pop("ANSIBLE_STRATEGY", None)
    env.update(extra_env or {})
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu": {"hosts": dict((h, {}) for h in HOSTS)}},
                                                 "vars": {"ansible_connection": "local",
                                                          "ansible_python_interpreter": sys.executable}}}))
    return subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory)] + argv,
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=300)


def recap(stdout):
    """PLAY RECAP as {host: {"ok": n, "changed": n, ...}}."""
    counts = {}
    for line in stdout.split("PLAY RECAP", 1)[1].strip().splitlines():
        if ":" not in line:
            continue
        host, rest = line.split(":", 1)
        counts[host.strip()] = dict((k, int(v)) for k, v in (item.split("=") for item in rest.split()))
    return counts


def test_runs_every_host_in_lockstep_with_more_hosts_than_forks(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    play = [{"name": "strategy", "hosts": "gpu", "gather_facts": False, "strategy": "gpufleet.inference.linear",
             "tasks": [
                 {"name": "first", "ansible.builtin.shell": "sleep 0.3; date +%s.%N > " + str(marks) + "/1-{{ inventory_hostname }}"},
                 {"name": "second", "ansible.builtin.shell": "date +%s.%N > " + str(marks) + "/2-{{ inventory_hostname }}"},
                 {"name": "throttled", "ansible.builtin.command": "true", "throttle": 1},
             ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    result = playbook(tmp_path, [str(tmp_path / "play.yml")])
    assert result.returncode == 0, result.stdout + result.stderr
    counts = recap(result.stdout)
    assert sorted(counts) == sorted(HOSTS)
    for host in HOSTS:
        assert (counts[host]["ok"], counts[host]["changed"], counts[host]["failed"]) == (3, 3, 0), counts
    first = [float((marks / ("1-" + h)).read_text()) for h in HOSTS]
    second = [float((marks / ("2-" + h)).read_text()) for h in HOSTS]
    assert max(first) <= min(second)  # linear: no host starts the second task before all ended the first


def test_a_failing_host_does_not_stop_the_others(tmp_path):
    play = [{"name": "strategy", "hosts": "gpu", "gather_facts": False, "strategy": "gpufleet.inference.linear",
             "tasks": [{"name": "fails on h3", "ansible.builtin.command": "test {{ inventory_hostname }} != h3"},
                       {"name": "after", "ansible.builtin.command": "true"}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    result = playbook(tmp_path, [str(tmp_path / "play.yml")])
    assert result.returncode == 2
    counts = recap(result.stdout)
    assert (counts["h3"]["failed"], counts["h3"]["ok"]) == (1, 0), counts
    for host in HOSTS:
        if host != "h3":
            assert (counts[host]["ok"], counts[host]["failed"]) == (2, 0), counts


def test_the_rollout_takes_the_strategy_from_the_extra_var_then_the_operators_config(tmp_path):
    rollout = str(REPO / "playbooks" / "rollout.yml")
    chosen = playbook(tmp_path, [rollout, "-e", "rollout_strategy=gpufleet.inference.no_such_strategy"])
    assert chosen.returncode != 0
    assert "gpufleet.inference.no_such_strategy" in chosen.stdout + chosen.stderr
    configured = playbook(tmp_path, [rollout], {"ANSIBLE_STRATEGY": "gpufleet.inference.operators_strategy"})
    assert configured.returncode != 0
    assert "gpufleet.inference.operators_strategy" in configured.stdout + configured.stderr
    # neither reached a task: the strategy is loaded before the first one
    for result in (chosen, configured):
        assert "TASK [" not in result.stdout


DEPRECATED = "Use of strategy plugins not included in ansible.builtin are deprecated"


def test_the_playbooks_run_ansibles_own_strategy_unless_asked(tmp_path):
    """By default rollout and verify run the strategy of ansible.cfg (ansible.builtin.linear here),
    not the collection's: ansible-core 2.19 prints a deprecation at each play that loads a strategy
    from outside ansible.builtin. The same run with the opt-in variable shows that warning (so its
    absence is not a check that cannot fail)."""
    for name, var in (("rollout.yml", "rollout_strategy"), ("verify.yml", "verify_strategy")):
        path = str(REPO / "playbooks" / name)
        default = playbook(tmp_path, [path], {"ANSIBLE_DEPRECATION_WARNINGS": "1"})
        opted = playbook(tmp_path, [path, "-e", "%s=gpufleet.inference.linear" % var],
                         {"ANSIBLE_DEPRECATION_WARNINGS": "1"})
        for result in (default, opted):
            assert "TASK [" in result.stdout, (name, result.stdout + result.stderr)  # its first play ran
        assert DEPRECATED not in " ".join((default.stdout + default.stderr).split()), name
        assert DEPRECATED in " ".join((opted.stdout + opted.stderr).split()), (name, opted.stdout + opted.stderr)

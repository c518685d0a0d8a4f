"""Issue 8 on the lab: verdicts that cannot lie (real systemd, real journald, the simulator).

Each reproduction of the issue's "What was found" is a scenario: a sequence of role runs,
playbooks and hand-made changes on hosts of its own. The scenarios selected by the tests being
run go at once, each in a thread with its own hosts (a scenario that finds no free host waits for
one), so the module costs about its longest scenario. Tests then read what each step returned.
Every scenario starts and ends with clean hosts.

    dropin     intent "no speculative decoding", a drop-in that launches DFLASH (window 512)
    retention  a healthy host whose journal was vacuumed, with and without its receipt
    faults     simulator faults, two hosts per wave: journald's rate limit eating the config line
               of the seed incident, a crash during the settle window, deaths after the config
               line, an unbindable host, a draft worker initialised twice
    rollout    a rollout whose new process crashes seconds after its first answer
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import traceback
import urllib.request

import pytest
from lab_support import CLEAN_HOST, ansible_playbook
from role_support import (BASE_ENV, BLOCKING_TASK, DROP_IN_DIR, EXPECT_2048, LAST_GOOD_RECORD, RECEIPT, RUN_ENV,
                          VERIFY_TASK, WAIT_TASK, Results, generate, host_json, invocation_journal,
                          per_host_role_playbook, ready_playbook, role_playbook, unit_checksum, verified_fact,
                          verify_records, wait_for, wait_result, replaced_invocation)

TIMEOUT = 120  # sglang_ready_timeout of every deploy here; a crash must be reported far sooner
SOON = 60      # "far sooner": well below TIMEOUT, with room for a loaded 2-core machine
DROP_IN = f"{DROP_IN_DIR}/override.conf"
CONFIG_LINE = "Initialized DFLASH draft runner"
RETENTION = "journal retention"
NOT_EVIDENCE = "/server_info only echoes the parsed arguments and does not count"
FALSE_BLAME = "SGLang logs it before the port opens"  # the old missing_config_line wording
OTHER_INVOCATION = "0123456789abcdef0123456789abcdef"

OFF_KEYS = ("sglang_speculative_draft_model_path", "sglang_speculative_num_draft_tokens",
            "sglang_speculative_draft_window_size")
PER_HOST = ("sglang_environment", "sglang_restart", "sglang_restart_sec", "sglang_host", "sglang_port",
            "sglang_min_ready_seconds", "sglang_journal_rate_limit_burst", "sglang_accept_unverified",
            "sglang_ready_timeout")


def drop_in_text(address: str) -> str:
    """What the operator of issue 8 wrote: ExecStart reset, DFLASH with window 512."""
    return ("[Service]\nExecStart=\nExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server "
            "--model-path /models/moonshotai/Kimi-K2.6 --served-model-name kimi-k2.6 --tp-size 8 "
            f"--host {address} --port 30000 --speculative-algorithm DFLASH "
            "--speculative-draft-model-path /models/dflash/Kimi-K2.6-DFlash --speculative-num-draft-tokens 16 "
            "--speculative-dflash-draft-window-size 512\n")


def server_info(address: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://{address}:30000/server_info", timeout=10) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


# What a phase text in a message may be once the journal shows a line (startup order).
PHASES_FROM = {
    CONFIG_LINE: ("draft runner initialised", "HTTP server up", "warmed up", "settling", "serving"),
    "Uvicorn running on": ("HTTP server up", "warmed up", "settling", "serving"),
}


def phase_in(msg: str) -> str:
    """The phase an ended_message names: '... after N.Ns, while PHASE[ (exit)][. Cause|. Last]'."""
    match = re.search(r" after [\d.]+s, while (.*?)(?: \(code=| \(Result |\. Cause: |\. Last \d+ journal lines)", msg)
    assert match, msg
    return match.group(1)


def assert_phase_reflects_the_journal(result: dict, journal: str):
    """Issue 8 (5): the phase in the message is at least what the invocation logged (its journal,
    read on the host after the fact; the tail in the result is the last 20 of those lines)."""
    phase = phase_in(result["msg"])
    assert "no config line yet" not in result["msg"], result["msg"]
    logged = journal + "\n".join(result.get("journal_tail") or [])
    for line, phases in PHASES_FROM.items():
        if line in logged:
            assert phase.startswith(phases), (phase, line, result["msg"])


# ------------------------------------------------------------------ scenarios

class HostPool:
    """Lab hosts lent to scenarios, first come first served: take() blocks until it is the turn of
    `ticket` and enough hosts are free."""

    def __init__(self, hosts):
        self.free = list(hosts)
        self.turn = 0
        self.cond = threading.Condition()

    def take(self, count, ticket):
        with self.cond:
            self.cond.wait_for(lambda: self.turn == ticket and len(self.free) >= count)
            taken, self.free = self.free[:count], self.free[count:]
            self.turn += 1
            self.cond.notify_all()
            return taken

    def give(self, hosts):
        with self.cond:
            self.free.extend(hosts)
            self.cond.notify_all()


class Story:
    """One scenario: its hosts, and what each of its steps returned (filled by its thread)."""

    def __init__(self, name, inventory, workdir, server_vars):
        self.name = name
        self.inventory = inventory
        self.workdir = workdir
        self._server_vars = server_vars
        self.hosts = []
        self.steps = {}
        self.error = None
        self.seconds = None
        self._count = 0

    def step(self, name):
        if name not in self.steps:
            raise AssertionError(f"scenario {self.name}: step {name!r} did not run"
                                 + (f"; the scenario stopped with:\n{self.error}" if self.error else ""))
        return self.steps[name]

    def record(self, name, **values):
        self.steps.setdefault(name, {}).update(values)
        return self.steps[name]

    # --- role variables
    def server(self, **over) -> dict:
        """A DFLASH window-2048 server (conftest's LAB_SERVER_VARS) with short loads."""
        env = over.pop("env", None)
        data = self._server_vars(sglang_environment=dict(BASE_ENV), sglang_ready_timeout=TIMEOUT) | over
        data["sglang_environment"] = dict(data["sglang_environment"], **(env or {}))
        return data

    def server_off(self, **over) -> dict:
        """The same server meant to run WITHOUT speculative decoding."""
        data = self.server(**over)
        for key in OFF_KEYS:
            data.pop(key)
        data["sglang_speculative_algorithm"] = "none"
        return data

    # --- on the hosts
    @staticmethod
    def sh(host, command, check=True, timeout=60):
        """conftest's host_sh, with ssh's stdin from /dev/null: ssh sets O_NONBLOCK on its stdin, and
        the scenarios' threads share this process's stdin with each other's commands."""
        proc = subprocess.run(host["ssh"] + [command], check=False, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"{host['name']}: `{command}` failed rc={proc.returncode}:\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def state(self, host):
        """systemctl show of sglang.service (conftest's unit_state, through sh above)."""
        out = self.sh(host, "systemctl show sglang.service -p InvocationID,ActiveState,SubState,MainPID,NRestarts",
                      check=False)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def clean(self):
        for host in self.hosts:
            self.sh(host, CLEAN_HOST, check=False, timeout=120)

    # --- playbooks
    def _playbook(self, text):
        self._count += 1
        path = self.workdir / f"{self._count:02d}.yml"
        path.write_text(text)
        return path

    def _run(self, name, playbook, extra_vars, **values):
        started = time.monotonic()
        run = ansible_playbook(self.inventory, playbook, extra_vars, env=RUN_ENV)
        return self.record(name, run=run, results=Results(run.out), seconds=time.monotonic() - started, **values)

    def role(self, name, host, variables):
        snapshot = self.state(host)
        return self._run(name, self._playbook(role_playbook(host["name"])), variables, before=snapshot)

    def per_host_role(self, table):
        """{step name: (host, variables)} in one play: the per-host variables (PER_HOST) from a table."""
        hosts = [host for host, variables in table.values()]
        common = {key: value for key, value in self.server().items() if key not in PER_HOST}
        per_host = {}
        for host, variables in table.values():
            per_host[host["name"]] = {key: variables.get(key, default) for key, default in (
                ("sglang_environment", dict(BASE_ENV)), ("sglang_restart", "on-failure"), ("sglang_restart_sec", 10),
                ("sglang_host", host["address"]), ("sglang_port", 30000), ("sglang_min_ready_seconds", 10),
                ("sglang_journal_rate_limit_burst", 100000), ("sglang_accept_unverified", False),
                ("sglang_ready_timeout", TIMEOUT))}
        playbook = self._playbook(per_host_role_playbook(":".join(h["name"] for h in hosts), PER_HOST))
        started = time.monotonic()
        run = ansible_playbook(self.inventory, playbook, common | {"gpf_per_host": per_host}, env=RUN_ENV)
        seconds = time.monotonic() - started
        results = Results(run.out)
        for name, (host, variables) in table.items():
            found = results.of(WAIT_TASK, host["name"])
            self.record(name, host=host, run=run, results=results, seconds=seconds,
                        status=found[0]["status"] if found else None, result=found[0]["result"] if found else {})

    def verify(self, name, host, variables):
        results_dir = self.workdir / f"verify-{name}"
        variables = dict(variables, verify_hosts=host["name"], verify_results_dir=str(results_dir))
        step = self._run(name, "playbooks/verify.yml", variables)
        step["record"] = verify_records(results_dir).get(host["name"]) if results_dir.is_dir() else None
        return step

    def ready(self, name, host, **module_args):
        playbook = self._playbook(ready_playbook(host["name"], **module_args))
        step = self._run(name, playbook, None)
        found = step["results"].of("sglang_ready", host["name"])
        step.update(status=found[0]["status"] if found else None, result=found[0]["result"] if found else {})
        return step

    def rollout(self, name, host, variables):
        results_dir = self.workdir / f"rollout-{name}"
        variables = dict(variables, rollout_hosts=host["name"], sglang_router_url="",
                         rollout_results_dir=str(results_dir))
        step = self._run(name, "playbooks/rollout.yml", variables)
        summaries = sorted(results_dir.glob("*/summary.json"), key=lambda path: path.stat().st_mtime)
        summary = json.loads(summaries[-1].read_text()) if summaries else {}
        step["summary"] = {record["host"]: record for record in summary.get("hosts", [])}
        return step


def scenario_dropin(story):
    host = story.hosts[0]
    story.role("deploy_off", host, story.server_off())
    story.record("deploy_off", state=story.state(host))
    story.record("deploy_off", journal=invocation_journal(story.sh, host, story.state(host)["InvocationID"]))
    # By hand, as in the issue: a drop-in resets ExecStart=, daemon-reload, restart.
    story.sh(host, f"mkdir -p {DROP_IN_DIR} && cat > {DROP_IN} <<'EOF'\n{drop_in_text(host['address'])}EOF\n"
                   "systemctl daemon-reload && systemctl restart sglang.service")
    wait_for(lambda: generate(host["address"]), 60, what="the overridden server")
    overridden = story.state(host)
    story.record("overridden", state=overridden, unit=unit_checksum(story.sh, host),
                 journal=invocation_journal(story.sh, host, overridden["InvocationID"]))
    story.verify("verify", host, story.server_off())
    story.role("role_blocked", host, story.server_off())
    story.record("role_blocked", after=story.state(host), unit=unit_checksum(story.sh, host))
    # The drop-in on disk but not loaded yet (nobody ran daemon-reload): the role changes the unit,
    # its restart handler reloads systemd, and the new process runs what the drop-in says.
    story.sh(host, f"rm -rf {DROP_IN_DIR} && systemctl daemon-reload && mkdir -p {DROP_IN_DIR} && "
                   f"cat > {DROP_IN} <<'EOF'\n{drop_in_text(host['address'])}EOF\n")
    story.record("pending_drop_in", show=story.sh(host, "systemctl show sglang.service -p DropInPaths,NeedDaemonReload"))
    story.role("role_restart", host, story.server_off(env={"GPF_EPOCH": "2"}))
    story.record("role_restart", after=story.state(host), receipt=host_json(story.sh, host, RECEIPT))


def scenario_retention(story):
    host = story.hosts[0]
    story.role("deploy", host, story.server())
    invocation = story.state(host)["InvocationID"]
    story.record("deploy", invocation=invocation, receipt=host_json(story.sh, host, RECEIPT))
    story.ready("nothing_expected", host, expect={}, config_line="optional", min_ready_seconds=0)
    # Retention on a long-running host: every archived journal file removed, the start of the
    # invocation with them. (--vacuum-time keeps a file whose last entry is younger than 1 s.)
    story.sh(host, "journalctl --rotate && sleep 2 && journalctl --vacuum-time=1s")
    story.record("vacuumed", journal=invocation_journal(story.sh, host, invocation), state=story.state(host))
    story.verify("verify_receipt", host, story.server())
    story.ready("ready_receipt", host, expect=EXPECT_2048, min_ready_seconds=10, timeout=60)
    story.role("role_receipt", host, story.server())
    story.record("role_receipt", after=story.state(host))
    story.sh(host, f"mv {RECEIPT} /root/gpf-receipt.json")
    story.verify("verify_no_receipt", host, story.server())
    story.ready("ready_no_receipt", host, expect=EXPECT_2048, min_ready_seconds=10, timeout=60)
    unit = unit_checksum(story.sh, host)
    story.role("role_no_receipt", host, story.server())
    story.record("role_no_receipt", after=story.state(host), unit_before=unit, unit_after=unit_checksum(story.sh, host))
    # The receipt of ANOTHER invocation (same unit, same settings) at the receipt's path.
    story.sh(host, "python3 -c 'import json; r = json.load(open(\"/root/gpf-receipt.json\")); "
                   f"r[\"invocation_id\"] = \"{OTHER_INVOCATION}\"; json.dump(r, open(\"{RECEIPT}\", \"w\"))'")
    story.ready("ready_other_receipt", host, expect=EXPECT_2048, min_ready_seconds=10, timeout=60)
    story.record("ready_other_receipt", receipt_after=host_json(story.sh, host, RECEIPT))
    story.sh(host, "rm -f /root/gpf-receipt.json", check=False)


def held_port():
    """A socket of this machine on 127.0.0.1 and a free port: while it is open, a server of any lab host
    that binds the IPv6 wildcard (dual-stack) on that port fails as SGLang does with a port in use (the lab
    hosts share this machine's network) - whatever else runs on the lab at the time."""
    import socket
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    return holder, holder.getsockname()[1]


HELD, HELD_PORT = held_port()  # held for the whole session: nothing else ever binds it

# Two hosts per wave; each entry: step name -> per-host role variables.
FAULT_WAVES = [
    {"flood": {"sglang_journal_rate_limit_burst": 100,
               "sglang_environment": BASE_ENV | {"SGLANG_SIM_FAULT": "ignore_window,log_flood=5000"}},
     "flood_accepted": {"sglang_journal_rate_limit_burst": 100, "sglang_accept_unverified": True,
                        "sglang_environment": BASE_ENV | {"SGLANG_SIM_FAULT": "ignore_window,log_flood=5000"}}},
    # The only long load here: the wait must be watching BEFORE the first answer for the crash 2 s
    # after it to fall into the settle window (a loaded machine takes 5-15 s to start the module).
    {"settle_crash": {"sglang_restart": "always", "sglang_restart_sec": 1,
                      "sglang_environment": BASE_ENV | {"SGLANG_SIM_FAULT": "crash_after_ready=2",
                                                        "SGLANG_SIM_LOAD_SECONDS": "20"}},
     "bind_no_restart": {"sglang_host": "::", "sglang_port": HELD_PORT, "sglang_restart": "no"}},
    {"crash_after_ready_0": {"sglang_restart": "no",
                             "sglang_environment": BASE_ENV | {"SGLANG_SIM_FAULT": "crash_after_ready=0"}},
     "reinit_draft": {"sglang_environment": BASE_ENV | {"SGLANG_SIM_FAULT": "reinit_draft=512"}}},
    {"reinit_after_ready": {"sglang_environment": BASE_ENV | {"SGLANG_SIM_FAULT": "reinit_draft_after_ready=3:512"}},
     "bind_restart": {"sglang_host": "::", "sglang_port": HELD_PORT}},  # Restart=on-failure, the role's default
]


def scenario_faults(story):
    for wave in FAULT_WAVES:
        story.clean()
        table = {name: (host, variables) for (name, variables), host in zip(wave.items(), story.hosts)}
        story.per_host_role(table)
        for name, (host, variables) in table.items():
            result = story.step(name)["result"]
            invocation = result.get("invocation_id")
            story.record(name, state=story.state(host), receipt=host_json(story.sh, host, RECEIPT),
                         server_info=server_info(host["address"]),
                         journal=invocation_journal(story.sh, host, invocation) if invocation else "")


def scenario_rollout(story):
    host = story.hosts[0]
    story.rollout("good", host, story.server())
    story.record("good", last_good=host_json(story.sh, host, LAST_GOOD_RECORD),
                 last_good_sums=story.sh(host, f"sha256sum {LAST_GOOD_RECORD.rsplit('/', 1)[0]}/*"),
                 state=story.state(host))
    crashing = story.server(sglang_restart="always", sglang_restart_sec=1,
                            env={"SGLANG_SIM_FAULT": "crash_after_ready=2"})
    story.rollout("crashing", host, crashing)
    story.record("crashing", last_good=host_json(story.sh, host, LAST_GOOD_RECORD),
                 last_good_sums=story.sh(host, f"sha256sum {LAST_GOOD_RECORD.rsplit('/', 1)[0]}/*"),
                 receipt=host_json(story.sh, host, RECEIPT), state=story.state(host))


# name -> (hosts, function), longest first: hosts are lent in this order.
SCENARIOS = {"faults": (2, scenario_faults), "dropin": (1, scenario_dropin), "retention": (1, scenario_retention),
             "rollout": (1, scenario_rollout)}


@pytest.fixture(scope="module")
def stories(request, lab_hosts, lab_inventory, tmp_path_factory, server_vars):
    """Run the scenarios the selected tests need, in parallel; {name: Story}."""
    selected = {name for item in request.session.items if item.module is request.module and item.cls is not None
                for name in getattr(item.cls, "SCENARIOS", ())}
    wanted = [name for name in SCENARIOS if name in selected]
    pool = HostPool(lab_hosts)
    if max([SCENARIOS[name][0] for name in wanted] or [0]) > len(lab_hosts):
        pytest.skip("the lab has too few hosts for these scenarios")
    stories = {name: Story(name, lab_inventory, tmp_path_factory.mktemp(name), server_vars) for name in wanted}

    def play(story, ticket):
        count, function = SCENARIOS[story.name]
        story.hosts = pool.take(count, ticket)
        started = time.monotonic()
        try:
            story.clean()
            function(story)
        except Exception:  # pylint: disable=broad-except  # the tests report it, with the steps that ran
            story.error = traceback.format_exc()
        finally:
            story.clean()
            story.seconds = time.monotonic() - started
            pool.give(story.hosts)

    threads = [threading.Thread(target=play, args=(story, ticket), name=story.name)
               for ticket, story in enumerate(stories.values())]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return stories


def failed_item(step, task, host):
    item = step["results"].one(task, host["name"])
    assert item["status"] == "fatal", item
    return item["result"]


def report_line(step, host):
    """verify's report line of a host, as the run printed it."""
    return next(line for line in step["run"].out.splitlines() if line.startswith(f"{host['name']}: "))


# ------------------------------------------------------------------ 1. a drop-in override

class TestDropInOverride:
    """Intent: no speculative decoding. A drop-in resets ExecStart= and runs DFLASH, window 512."""
    SCENARIOS = ("dropin",)

    def test_off_intent_passes_and_names_what_was_compared(self, stories, record_verdict):
        step = stories["dropin"].step("deploy_off")
        assert step["run"].rc == 0, step["run"]
        result = wait_result(step["results"], stories["dropin"].hosts[0])
        assert result["verdict"] == "pass" and result["config_line_mode"] == "absent", result["msg"]
        record_verdict(result)
        assert "compared no draft-runner line, as intended (speculative decoding off); its command line" \
            in result["msg"], result["msg"]
        assert "agrees" not in result["msg"]
        assert result["config_lines"] == [] and result["observed"] is None and result["source"] == "journal"
        assert result["invocation_id"] == step["state"]["InvocationID"]
        # ground truth: its journal is complete and holds no draft-runner line
        assert CONFIG_LINE not in step["journal"] and "fired up and ready to roll" in step["journal"]

    def test_verify_reports_the_drop_in_as_drift(self, stories, record_verdict):
        story = stories["dropin"]
        host = story.hosts[0]
        assert "draft_window_size=512" in story.step("overridden")["journal"]  # what the override runs
        step = story.step("verify")
        assert step["run"].rc != 0, step["run"]
        record = step["record"]
        assert record["verdict"] == "drifted" and not record["in_sync"], record
        assert record["invocation_id"] == story.step("overridden")["state"]["InvocationID"]
        assert record["blocking"] and all(DROP_IN in item for item in record["blocking"]), record["blocking"]
        window = [d for d in record["differences"] if d["what"] == "effective unit"
                  and d["key"] == "ExecStart --speculative-dflash-draft-window-size"]
        assert window and window[0]["observed"] == "512" and window[0]["drop_ins"] == [DROP_IN], record
        assert any(d["what"] == "config line" and d["key"] == "draft_runner" and "draft_window_size=512"
                   in d["observed"] for d in record["differences"]), record["differences"]
        line = next(line for line in step["run"].out.splitlines() if line.startswith(f"{host['name']}: "))
        assert line.startswith(f"{host['name']}: DRIFTED") and DROP_IN in line, line
        record_verdict(record, source="verify", message=line)
        assert "in sync" not in step["run"].out

    def test_the_role_refuses_to_change_anything(self, stories):
        story = stories["dropin"]
        host = story.hosts[0]
        step = story.step("role_blocked")
        assert step["run"].rc != 0, step["run"]
        result = failed_item(step, BLOCKING_TASK, host)
        assert DROP_IN in result["msg"] and "Nothing changed" in result["msg"], result["msg"]
        assert step["results"].tasks_ran(host["name"])[-1] == BLOCKING_TASK
        assert step["results"].of(WAIT_TASK) == []
        before, after = story.step("overridden"), step
        assert after["unit"] == before["unit"]
        assert (after["after"]["InvocationID"], after["after"]["MainPID"]) == (
            before["state"]["InvocationID"], before["state"]["MainPID"])

    def test_a_restart_that_loads_the_drop_in_is_a_mismatch_naming_the_line_and_the_command_line(self, stories):
        story = stories["dropin"]
        host = story.hosts[0]
        # precondition: systemd had not loaded the drop-in when the role compared
        assert "DropInPaths=\n" in story.step("pending_drop_in")["show"], story.step("pending_drop_in")
        step = story.step("role_restart")
        assert step["run"].rc != 0, step["run"]
        result = failed_item(step, WAIT_TASK, host)
        msg = result["msg"]
        assert result["verdict"] == "mismatch", msg
        assert "expected no draft-runner line (speculative decoding off), but it logged" in msg, msg
        assert "draft_window_size=512" in msg
        assert "--speculative-algorithm: expected nothing, observed DFLASH on the command line of its main process" \
            in msg, msg
        assert "--speculative-dflash-draft-window-size: expected nothing, observed 512" in msg, msg
        assert f"drop-ins of sglang.service: {DROP_IN}" in msg, msg
        assert result["launched"]["drop_in_paths"] == [DROP_IN]
        # the NEW process: the wait followed the invocation that replaced the one running before
        assert replaced_invocation(step["results"], host) == step["before"]["InvocationID"]
        assert result["phases"]["new_invocation"]["invocation_id"] == result["invocation_id"] \
            == step["after"]["InvocationID"] != step["before"]["InvocationID"]
        assert result["elapsed"] < SOON
        receipt = step["receipt"] or {}
        assert receipt.get("invocation_id") != result["invocation_id"], receipt  # never verified


# ------------------------------------------------------------------ 2. the seed incident, line lost to journald

class TestSeedIncidentUnderJournaldRateLimit:
    """ignore_window (the runtime runs no window) + a flood that journald's low limit (burst 100) cuts."""
    SCENARIOS = ("faults",)

    def test_lost_config_line_is_unverified_and_server_info_does_not_count(self, stories, record_verdict):
        step = stories["faults"].step("flood")
        result = step["result"]
        assert step["status"] == "fatal", step["run"]
        msg = result["msg"]
        assert result["verdict"] == "unverified", msg
        record_verdict(result)
        assert "journald's rate limit dropped" in msg and "Suppressed" in msg, msg
        assert NOT_EVIDENCE in msg
        assert result["observed"] is None and result["source"] is None and result["config_line"] is None
        assert result["verified"] is False and result["receipt"] is None and step["receipt"] is None
        assert result["suppression"]["messages_dropped"] > 1000, result["suppression"]
        assert result["elapsed"] < TIMEOUT - 30, result["elapsed"]  # a verdict, not the timeout
        # ground truth: the line is not in the journal, and /server_info echoes the flag it ignores
        assert CONFIG_LINE not in step["journal"]
        assert step["server_info"]["speculative_dflash_draft_window_size"] == 2048, step["server_info"]

    def test_accept_unverified_passes_with_verified_false_and_a_warning(self, stories):
        story = stories["faults"]
        step = story.step("flood_accepted")
        result = step["result"]
        assert step["status"] in ("ok", "changed"), step["run"]
        msg = result["msg"]
        assert result["verdict"] == "pass" and result["verified"] is False, msg
        assert "UNVERIFIED (accepted by accept_unverified)" in msg and "journald's rate limit dropped" in msg, msg
        assert result["observed"] is None and result["source"] is None
        assert f"[WARNING]: {msg}" in step["run"].out  # the module's warning, as Ansible shows it
        assert result["receipt"] is None and step["receipt"] is None  # no receipt without evidence
        assert verified_fact(step["results"], step["host"])["verified"] is False


# ------------------------------------------------------------------ 3. settle before ok

class TestSettleBeforeOk:
    """sglang_restart: always and crash_after_ready=2: it answers, then crashes within min_ready_seconds."""
    SCENARIOS = ("faults", "rollout")

    def test_a_crash_seconds_after_the_first_answer_fails_the_wait(self, stories):
        step = stories["faults"].step("settle_crash")
        result = step["result"]
        assert step["status"] == "fatal", step["run"]
        msg = result["msg"]
        assert result["verdict"] == "crash_loop", msg
        assert "generate" in result["phases"], result["phases"]  # it did answer ...
        assert "while settling after its first good /generate" in msg, msg  # ... and died settling
        assert "status=9/KILL" in msg and "Result signal" in msg, msg
        assert "simulated crash_after_ready" in msg
        assert result["elapsed"] < SOON, result["elapsed"]
        assert result["receipt"] is None and step["receipt"] is None
        # systemd restarted it, or is about to (auto-restart, RestartSec=1)
        state = step["state"]
        assert state["InvocationID"] != result["invocation_id"] or int(state["NRestarts"]) >= 1 \
            or state["SubState"].startswith("auto-restart"), state

    def test_a_rollout_keeps_the_old_last_known_good(self, stories):
        story = stories["rollout"]
        host = story.hosts[0]
        good, crashing = story.step("good"), story.step("crashing")
        assert good["run"].rc == 0, good["run"]
        assert good["summary"][host["name"]]["status"] == "updated", good["summary"]
        saved = good["last_good"]
        assert saved and saved["invocation_id"] == good["state"]["InvocationID"], saved
        assert crashing["run"].rc != 0, crashing["run"]
        record = crashing["summary"][host["name"]]
        assert record["status"] == "reverted" and record["failed_task"] == WAIT_TASK, record
        assert "status=9/KILL" in record["error"] and "crash_after_ready" in record["error"], record["error"]
        # last-known-good is the OLD one, file for file
        assert crashing["last_good_sums"] == good["last_good_sums"]
        assert crashing["last_good"] == saved
        # the only receipt is the reverted process's
        assert crashing["receipt"]["invocation_id"] == record["revert"]["invocation_id"] \
            == crashing["state"]["InvocationID"], (crashing["receipt"], record["revert"])


# ------------------------------------------------------------------ 4. journal retention

class TestJournalRetention:
    """A healthy long-running host after `journalctl --rotate; journalctl --vacuum-time=1s`."""
    SCENARIOS = ("retention",)

    def test_ground_truth_the_start_of_the_invocation_is_gone(self, stories):
        story = stories["retention"]
        assert story.step("deploy")["run"].rc == 0, story.step("deploy")["run"]
        vacuumed = story.step("vacuumed")
        assert vacuumed["state"]["InvocationID"] == story.step("deploy")["invocation"]
        assert "server_args=" not in vacuumed["journal"] and CONFIG_LINE not in vacuumed["journal"], \
            vacuumed["journal"][-2000:]
        assert story.step("deploy")["receipt"]["invocation_id"] == story.step("deploy")["invocation"]

    def test_a_pass_without_an_expectation_says_nothing_was_compared(self, stories):
        step = stories["retention"].step("nothing_expected")
        assert step["status"] in ("ok", "changed"), step["run"]
        msg = step["result"]["msg"]
        assert step["result"]["verdict"] == "pass"
        assert "nothing was compared (no expectation given): readiness only" in msg and "agrees" not in msg, msg

    def test_with_the_receipt_verify_says_in_sync(self, stories, record_verdict):
        story = stories["retention"]
        step = story.step("verify_receipt")
        assert step["run"].rc == 0, step["run"]
        record = step["record"]
        assert record["verdict"] == "in_sync" and record["source"] == "receipt" and record["receipt"] is True, record
        assert record["observed"]["draft_window_size"] == 2048
        assert "All 1 host(s) in sync" in step["run"].out
        record_verdict(record, source="verify", message=report_line(step, story.hosts[0]))

    def test_with_the_receipt_sglang_ready_passes_from_the_receipt(self, stories):
        story = stories["retention"]
        step = story.step("ready_receipt")
        assert step["status"] in ("ok", "changed"), step["run"]
        result = step["result"]
        assert result["verdict"] == "pass" and result["source"] == "receipt" and result["verified"], result["msg"]
        assert result["invocation_id"] == story.step("deploy")["invocation"]
        assert "(config line from the receipt of its verification)" in result["msg"], result["msg"]
        assert result["observed"]["draft_window_size"] == 2048
        assert result["elapsed"] < 10  # verified long ago: no new settle window

    def test_with_the_receipt_a_no_change_role_run_does_not_wait_again(self, stories):
        story = stories["retention"]
        host = story.hosts[0]
        step = story.step("role_receipt")
        assert step["run"].rc == 0, step["run"]
        assert step["results"].recap[host["name"]]["changed"] == 0, step["results"].recap
        assert "verified before, receipt kept" in step["results"].one(VERIFY_TASK, host["name"])["result"]["msg"]
        fact = verified_fact(step["results"], host)
        assert fact["verdict"] == "pass" and fact["source"] == "receipt", fact
        assert fact["invocation_id"] == story.step("deploy")["invocation"] == step["after"]["InvocationID"]

    def test_without_the_receipt_verify_is_unverified_naming_retention(self, stories, record_verdict):
        step = stories["retention"].step("verify_no_receipt")
        assert step["run"].rc != 0, step["run"]
        record = step["record"]
        assert record["verdict"] == "unverified" and record["differences"] == [], record
        assert RETENTION in record["unverified_reason"] and "no receipt" in record["unverified_reason"], record
        assert "DRIFTED" not in step["run"].out and "missing_config_line" not in step["run"].out
        assert FALSE_BLAME not in step["run"].out
        record_verdict(record, source="verify", message=report_line(step, stories["retention"].hosts[0]))

    def test_without_the_receipt_sglang_ready_is_unverified_naming_retention(self, stories):
        step = stories["retention"].step("ready_no_receipt")
        assert step["status"] == "fatal", step["run"]
        result = step["result"]
        assert result["verdict"] == "unverified", result["msg"]
        assert RETENTION in result["msg"] and RECEIPT.rsplit("/", 1)[0] in result["msg"], result["msg"]
        assert FALSE_BLAME not in result["msg"]
        assert result["observed"] is None and result["source"] is None
        assert result["elapsed"] < 10  # no 35 s journal_grace: the start is gone, waiting cannot bring it back

    def test_without_the_receipt_a_no_change_role_run_fails_unverified_and_restarts_nothing(self, stories):
        story = stories["retention"]
        host = story.hosts[0]
        step = story.step("role_no_receipt")
        assert step["run"].rc != 0, step["run"]
        result = failed_item(step, VERIFY_TASK, host)
        assert result["verdict"] == "unverified" and RETENTION in result["msg"], result["msg"]
        assert step["results"].of(WAIT_TASK) == []
        assert step["unit_after"] == step["unit_before"]
        assert step["after"]["InvocationID"] == step["before"]["InvocationID"] == story.step("deploy")["invocation"]

    def test_a_receipt_of_another_invocation_never_counts(self, stories):
        step = stories["retention"].step("ready_other_receipt")
        assert step["status"] == "fatal", step["run"]
        result = step["result"]
        assert result["verdict"] == "unverified" and RETENTION in result["msg"], result["msg"]
        assert result["source"] is None and result["observed"] is None
        assert step["receipt_after"]["invocation_id"] == OTHER_INVOCATION  # left alone, not overwritten


# ------------------------------------------------------------------ 5, 6. honest failure messages

class TestDeathMessages:
    SCENARIOS = ("faults",)

    def test_a_crash_after_the_config_line_names_the_phase_it_reached(self, stories):
        step = stories["faults"].step("crash_after_ready_0")
        result = step["result"]
        assert step["status"] == "fatal", step["run"]
        assert result["verdict"] == "died", result["msg"]
        assert CONFIG_LINE in step["journal"], step["journal"][-3000:]  # it died after its config line
        assert_phase_reflects_the_journal(result, step["journal"])
        assert "status=9/KILL" in result["msg"] and "Result signal" in result["msg"], result["msg"]
        assert "Cause: " in result["msg"]
        assert result["elapsed"] < SOON

    def test_an_unbindable_host_names_the_phase_exit_status_and_cause(self, stories):
        step = stories["faults"].step("bind_no_restart")
        result = step["result"]
        assert step["status"] == "fatal", step["run"]
        msg = result["msg"]
        assert result["verdict"] == "died", msg
        assert f"error while attempting to bind on address ('::', {HELD_PORT})" in msg, msg
        assert_phase_reflects_the_journal(result, step["journal"])
        assert phase_in(msg).startswith("draft runner initialised: block_size=16, draft_window_size=2048"), msg
        assert "status=1/FAILURE" in msg and "Result exit-code" in msg, msg
        assert result["elapsed"] < SOON
        assert step["state"]["ActiveState"] == "failed", step["state"]

    def test_an_unbindable_host_with_restart_is_a_crash_loop_with_its_exit_status(self, stories):
        step = stories["faults"].step("bind_restart")
        result = step["result"]
        assert step["status"] == "fatal", step["run"]
        msg = result["msg"]
        assert result["verdict"] == "crash_loop", msg
        assert "status=1/FAILURE" in msg and "Result exit-code" in msg, msg
        assert_phase_reflects_the_journal(result, step["journal"])
        assert result["elapsed"] < SOON


# ------------------------------------------------------------------ a draft worker initialised twice

class TestReinitialisedDraftWorker:
    SCENARIOS = ("faults",)

    def test_a_config_line_logged_twice_with_other_values_is_a_mismatch_naming_the_second(self, stories):
        step = stories["faults"].step("reinit_draft")
        result = step["result"]
        assert step["status"] == "fatal", step["run"]
        msg = result["msg"]
        assert result["verdict"] == "mismatch", msg
        assert "draft_window_size: expected 2048" in msg and "observed 512 in the second config line" in msg, msg
        assert len(result["config_lines"]) == 2 and "draft_window_size=2048" in result["config_lines"][0]
        assert result["receipt"] is None and step["receipt"] is None

    def test_a_reinitialisation_after_ready_fails_the_settle(self, stories):
        step = stories["faults"].step("reinit_after_ready")
        result = step["result"]
        assert step["status"] == "fatal", step["run"]
        msg = result["msg"]
        assert result["verdict"] == "mismatch", msg
        assert "observed 512 in the second config line" in msg, msg
        assert result["receipt"] is None and step["receipt"] is None
        assert result["elapsed"] < SOON

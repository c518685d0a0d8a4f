"""Helpers of the role/fault lab tests: playbook texts, parsing ansible-playbook output, probes.

Playbooks are run through conftest's `run_playbook` with RUN_ENV (every task result printed as
JSON), so a test reads the module's own return values instead of scraping YAML.
"""
from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request

# Every result as JSON (-v), in a form json.JSONDecoder can read back.
RUN_ENV = {"ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_VERBOSITY": "1"}

ROLE = "gpufleet.inference.sglang"
# The role's tasks whose results the tests read (names as the role spells them).
INSTALL_TASK = "Install what differs (accounts, journald's rate limit, the unit and its config file)"
WAIT_TASK = "Wait until the new SGLang process runs the intended settings"  # the restart handler
# After the handlers: the handler's verification, or a start, or a check of the running process; the fact.
VERIFY_TASK = VERIFIED_TASK = "Start SGLang when it is not running, else verify the running process"
DRIFT_TASK = "Compare this host with its intent (settings, SGLang version, unit, process, /server_info, arguments)"
BLOCKING_TASK = INSTALL_TASK  # drop-ins that override the role stop the install, before it writes anything
VALIDATE_TASK = DRIFT_TASK  # what a spec cannot check is checked first, before the host is asked anything
UNIT_PATH = "/etc/systemd/system/sglang.service"
DROP_IN_DIR = "/etc/systemd/system/sglang.service.d"
CONFIG_FILE = "/etc/sglang/sglang.yaml"  # SGLang's --config file: holds the API key
RECEIPT = "/var/lib/gpufleet-inference/receipts/sglang.service.json"
LAST_GOOD_RECORD = "/var/lib/gpufleet-inference/last-good/sglang.service/record.json"
WINDOW_FLAG = "--speculative-dflash-draft-window-size"  # the simulator's default profile is 0.5.11
# Short loads; SIGTERM drains polled every second instead of SGLang's 5 s (faster stops).
BASE_ENV = {"SGLANG_SIM_LOAD_SECONDS": "2", "SGLANG_SIM_DRAIN_POLL_SECONDS": "1"}
EXPECT_2048 = {"draft_window_size": 2048, "compact_cache": True, "block_size": 16}

_HEADER = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(?:(?P<role>[^:\]]+) : )?(?P<name>.*?)\] \**$")
_RESULT = re.compile(r"^(?P<status>ok|changed|fatal|failed|skipping): \[(?P<host>[^\]]+)\]"
                     r"(?::\s*FAILED!)?(?: => )?")
_RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$")


def role_playbook(hosts: str) -> str:
    """A play applying the role to `hosts` (vars come from run_playbook's extra vars)."""
    return f"""---
- name: Apply the SGLang role
  hosts: {hosts}
  gather_facts: false
  roles:
    - role: {ROLE}
"""


def per_host_role_playbook(hosts: str, per_host: tuple[str, ...], table: str = "gpf_per_host") -> str:
    """The role on `hosts` in parallel, each host with its own values of the `per_host` variables.

    The values come from the extra var `table` (host name -> {variable: value}); the other
    variables must be passed as extra vars too, but NOT the per-host ones (extra vars win).
    """
    lines = "\n".join(f'        {name}: "{{{{ {table}[inventory_hostname].{name} }}}}"' for name in per_host)
    return f"""---
- name: Apply the SGLang role with per-host settings
  hosts: {hosts}
  gather_facts: false
  roles:
    - role: {ROLE}
      vars:
{lines}
"""


def ready_playbook(hosts: str, expect: dict | None = None, timeout: float = 30,
                   after_invocation: str | None = None, poll_interval: float = 1, **module_args) -> str:
    """A play running sglang_ready once against each host's own sglang_host:30000 (more module
    arguments, e.g. min_ready_seconds or config_line, as keywords)."""
    args = {"unit": "sglang.service", "url": "http://{{ sglang_host }}:30000",
            "expect": expect or {}, "timeout": timeout, "poll_interval": poll_interval}
    if after_invocation:
        args["after_invocation"] = after_invocation
    args.update(module_args)
    return f"""---
- name: Verify the running SGLang process
  hosts: {hosts}
  gather_facts: false
  tasks:
    - name: sglang_ready
      gpufleet.inference.sglang_ready: {json.dumps(args)}
"""


class Results:
    """Task results of one ansible-playbook run (with RUN_ENV), in order."""

    def __init__(self, out: str):
        self.out = out
        self.items: list[dict] = []
        self.recap: dict[str, dict[str, int]] = {}
        decoder = json.JSONDecoder()
        task = None
        pos = 0
        in_recap = False
        while pos < len(out):
            end = out.find("\n", pos)
            end = len(out) if end < 0 else end
            line = out[pos:end]
            header = _HEADER.match(line)
            if header:
                task = header.group("name")
            elif line.startswith("PLAY RECAP"):
                in_recap = True
            elif in_recap and _RECAP.match(line):
                match = _RECAP.match(line)
                self.recap[match.group("host")] = {
                    key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group("counts"))}
            else:
                match = _RESULT.match(line)
                if match:
                    result = None
                    start = pos + match.end()
                    if out[start:start + 1] == "{":
                        try:
                            result, stop = decoder.raw_decode(out, start)
                            end = out.find("\n", stop)
                            end = len(out) if end < 0 else end
                        except ValueError:
                            result = None
                    self.items.append({"task": task, "host": match.group("host"),
                                       "status": match.group("status"), "result": result or {}})
            pos = end + 1

    def of(self, task: str, host: str | None = None) -> list[dict]:
        return [item for item in self.items
                if item["task"] == task and (host is None or item["host"] == host)]

    def one(self, task: str, host: str | None = None) -> dict:
        found = self.of(task, host)
        assert len(found) == 1, f"expected one result of {task!r} for {host}, got {found}\n{self.out[-4000:]}"
        return found[0]

    def tasks_ran(self, host: str) -> list[str]:
        return [item["task"] for item in self.items if item["host"] == host and item["status"] != "skipping"]


def wait_result(results: Results, host: dict) -> dict:
    """The result of the role's wait for the new process (the restart handler) on `host`."""
    return results.one(WAIT_TASK, host["name"])["result"]


def replaced_invocation(results: Results, host: dict) -> str | None:
    """The invocation the role's restart replaced: systemd's InvocationID right before its restart
    handler restarted it (what the wait is given as after_invocation); None when nothing ran before."""
    return results.one(WAIT_TASK, host["name"])["result"].get("replaced_invocation")


def verified_fact(results: Results, host: dict) -> dict:
    """The fact sglang_verified the role set on `host` (whichever step verified)."""
    return results.one(VERIFIED_TASK, host["name"])["result"]["ansible_facts"]["sglang_verified"]


def host_json(sh, host, path: str) -> dict | None:
    """A JSON file on a lab host, or None when it is not there."""
    text = sh(host, f"cat {path} 2>/dev/null || true", check=False).strip()
    return json.loads(text) if text else None


def unit_file(sh, host) -> str | None:
    text = sh(host, f"cat {UNIT_PATH} 2>/dev/null || echo __MISSING__", check=False)
    return None if text.strip() == "__MISSING__" else text


def unit_checksum(sh, host) -> str:
    return sh(host, f"sha256sum {UNIT_PATH} 2>/dev/null || echo missing", check=False).split()[0]


def invocation_journal(sh, host, invocation_id: str, fmt: str = "cat") -> str:
    return sh(host, f"journalctl _SYSTEMD_INVOCATION_ID={invocation_id} -o {fmt} --no-pager")


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def generate(address: str, port: int = 30000, timeout: float = 5, api_key: str | None = None) -> dict | None:
    """POST /generate to a lab server from the controller; the JSON answer, or None."""
    body = json.dumps({"text": "The capital of France is",
                       "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(f"http://{address}:{port}/generate", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read()) if resp.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


class GenerateProbe(threading.Thread):
    """POSTs /generate every `interval` seconds in the background; records (wall time, ok)."""

    def __init__(self, address: str, interval: float = 0.5):
        super().__init__(daemon=True)
        self.address = address
        self.interval = interval
        self.samples: list[tuple[float, bool]] = []
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            answer = generate(self.address, timeout=3)
            self.samples.append((time.time(), bool(answer and answer.get("text"))))
            self._stop_event.wait(self.interval)

    def stop(self):
        self._stop_event.set()
        self.join(10)


def verify_records(results_dir) -> dict:
    """{host: record} of the newest gpufleet.inference.verify run written under `results_dir`."""
    runs = [path.parent for path in results_dir.glob("*/summary.json")]
    assert runs, f"no verify report under {results_dir}"
    newest = max(runs, key=lambda path: (path / "summary.json").stat().st_mtime)
    summary = json.loads((newest / "summary.json").read_text())
    return {record["host"]: record for record in summary["hosts"]}

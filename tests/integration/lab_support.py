"""Helpers shared by the lab tests (imported by conftest.py and the test modules)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# Everything the role, a rollout or a test may have left on a host: unit and its drop-in directory,
# SGLang config file (API key), receipts and last-known-good copies (/var/lib/gpufleet-inference),
# journald drop-in (journald restarted when there was one, so a test's low rate limit does not
# outlive it), stray test servers. systemd stops by unit name, never by pattern.
# SIGKILL first: a test may leave a process that drains or ignores SIGTERM for minutes
# (TimeoutStopSec is sized for real loads); cleanup must not wait for it.
# Lab trap (systemd 252 in nspawn on a hybrid cgroup host): systemd sometimes misses the
# "cgroup empty" event and keeps an already-dead unit in "deactivating" until TimeoutStopSec;
# daemon-reexec makes it look again.
CLEAN_HOST = (
    "for u in sglang.service gpf-stray.service; do systemctl kill --signal=SIGKILL $u 2>/dev/null; "
    "timeout 20 systemctl stop $u 2>/dev/null; "
    "if [ \"$(systemctl is-active $u)\" = deactivating ]; then systemctl daemon-reexec; sleep 1; fi; "
    "systemctl disable $u 2>/dev/null; systemctl reset-failed $u 2>/dev/null; done; "
    "rm -rf /etc/systemd/system/sglang.service.d; "
    "rm -f /etc/systemd/system/sglang.service /etc/sglang/sglang.env /etc/sglang/sglang.yaml; "
    "if [ -e /etc/systemd/journald.conf.d/50-gpufleet-sglang.conf ]; then "
    "rm -f /etc/systemd/journald.conf.d/50-gpufleet-sglang.conf; systemctl restart systemd-journald; fi; "
    "rm -rf /var/lib/gpufleet-inference; systemctl daemon-reload; true"
)


class PlaybookRun:
    def __init__(self, proc: subprocess.CompletedProcess, seconds: float):
        self.rc = proc.returncode
        self.out = proc.stdout + proc.stderr
        self.seconds = seconds

    def __repr__(self):
        return f"PlaybookRun(rc={self.rc}, {self.seconds:.1f} s)\n{self.out[-8000:]}"


def ansible_playbook(inventory: Path, playbook, extra_vars: dict | None = None,
                     limit: str | None = None, check: bool = False, diff: bool = False,
                     timeout: float = 900, env: dict | None = None,
                     cwd: Path | None = None) -> PlaybookRun:
    """Run ansible-playbook with this checkout's collection; `playbook` is a path or a FQCN."""
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)]
    if extra_vars:
        argv += ["-e", json.dumps(extra_vars)]
    if limit:
        argv += ["--limit", limit]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    run_env = dict(os.environ)
    run_env.update({"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                    "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".build" / "collections"),
                    "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
                    # tests read every result, skipped ones too (the repo's ansible.cfg hides them)
                    "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "1"})
    run_env.update(env or {})
    started = time.monotonic()
    # stdin from /dev/null: Ansible refuses a non-blocking stdin, and an ssh started at the same
    # time (another thread's host_sh) sets O_NONBLOCK on the stdin it shares with this process.
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout,
                          env=run_env, cwd=str(cwd or REPO), stdin=subprocess.DEVNULL)
    return PlaybookRun(proc, time.monotonic() - started)

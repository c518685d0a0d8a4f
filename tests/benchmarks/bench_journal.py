"""Benchmark: the cost of reading the config line must not grow with the unit's journal.

Prints, for growing journal sizes of one unit on one lab host, the time of
  - `gpufleet.inference.sglang_info` (finds the current invocation's config line), and
  - the naive `journalctl -u UNIT | grep draft_window_size | tail -1` (reads the whole history,
    and returns the PREVIOUS process's line when the current one has not logged yet).

Usage (a lab must be up; `make lab-up` or any LAB_NAME):
    .venv/bin/python tests/benchmarks/bench_journal.py [--inventory inventories/lab/hosts.yml]
        [--host gpflab-1] [--flood 20000] [--rounds 4]

Each round restarts a simulator unit that logs --flood lines before its config line (journald's
rate limit is lifted for the run and restored after), so the unit's history grows by that much.
The unit and the drop-in are removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchlib import BENCH_TMP

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
UNIT = "gpf-bench-journal.service"
DROPIN = "/etc/systemd/journald.conf.d/50-gpf-bench.conf"


def host_of(inventory: Path, name: str | None) -> tuple[str, dict, dict]:
    group = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu"]
    name = name or next(iter(group["hosts"]))
    return name, group["hosts"][name], group["vars"]


def ssh_argv(hvars: dict, gvars: dict) -> list[str]:
    return ["ssh", "-i", gvars["ansible_ssh_private_key_file"], "-p", str(gvars["ansible_port"]),
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            f"root@{hvars['ansible_host']}"]


def sh(ssh: list[str], command: str, timeout: float = 300) -> str:
    proc = subprocess.run(ssh + [command], check=False, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"`{command}` failed: {proc.stderr.strip()}")
    return proc.stdout


def timed(fn):
    started = time.monotonic()
    out = fn()
    return time.monotonic() - started, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", type=Path, default=REPO / "inventories/lab/hosts.yml")
    parser.add_argument("--host")
    parser.add_argument("--flood", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if not args.inventory.is_file():
        print(f"no lab inventory at {args.inventory}: run `make lab-up` first", file=sys.stderr)
        return 1
    name, hvars, gvars = host_of(args.inventory, args.host)
    ssh = ssh_argv(hvars, gvars)
    addr = hvars["ansible_host"]
    port = 30999
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=str(REPO / ".build" / "collections"),
               ANSIBLE_HOME=str(BENCH_TMP.parent), ANSIBLE_REMOTE_TMP=str(BENCH_TMP))  # not the user's ~/.ansible
    exec_start = (f"/opt/sglang/venv/bin/python -m sglang.launch_server --model-path m --tp-size 8 "
                  f"--host {addr} --port {port} --speculative-algorithm DFLASH "
                  f"--speculative-draft-model-path d --speculative-num-draft-tokens 16 "
                  f"--speculative-dflash-draft-window-size 2048")
    sh(ssh, f"mkdir -p /etc/systemd/journald.conf.d && printf '[Journal]\\nRateLimitBurst=0\\n' > {DROPIN}"
            " && systemctl restart systemd-journald")
    sh(ssh, f"printf '[Service]\\nEnvironment=SGLANG_SIM_LOAD_SECONDS=0.5 SGLANG_SIM_FAULT=log_flood={args.flood}\\n"
            f"ExecStart={exec_start}\\n' > /etc/systemd/system/{UNIT} && systemctl daemon-reload")
    rows = []
    try:
        for round_no in range(args.rounds + 1):
            sh(ssh, f"systemctl restart {UNIT}")
            deadline = time.monotonic() + 120
            while "Initialized DFLASH" not in sh(ssh, f"journalctl _SYSTEMD_INVOCATION_ID="
                                                      f"$(systemctl show -p InvocationID --value {UNIT}) "
                                                      f"-g 'Initialized DFLASH' -o cat || true"):
                if time.monotonic() > deadline:
                    raise SystemExit("the bench unit never logged its config line")
                time.sleep(0.5)
            lines = int(sh(ssh, f"journalctl -u {UNIT} -o cat | wc -l").strip())
            module_s, out = timed(lambda: subprocess.run(
                [str(BIN / "ansible"), "-i", str(args.inventory), name, "-o", "-m",
                 "gpufleet.inference.sglang_info", "-a",
                 json.dumps({"unit": UNIT, "url": f"http://{addr}:{port}"})],
                check=False, capture_output=True, text=True, env=env, timeout=300))
            found = "draft_window_size" in out.stdout
            naive_s, _naive = timed(lambda: sh(
                ssh, f"journalctl -u {UNIT} --no-pager | grep draft_window_size | tail -1"))
            direct_s, _direct = timed(lambda: sh(
                ssh, f"journalctl _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID --value {UNIT})"
                     f" -o json -n 2000 --no-pager | wc -l"))
            rows.append((round_no, lines, module_s, found, direct_s, naive_s))
    finally:
        sh(ssh, f"systemctl stop {UNIT}; rm -f /etc/systemd/system/{UNIT} {DROPIN}; "
                "systemctl daemon-reload; systemctl restart systemd-journald; true")
    print(f"host {name}, unit {UNIT}, {args.flood} flood lines logged before each config line")
    print(f"{'round':>5} {'unit journal lines':>19} {'sglang_info s':>14} {'line found':>10} "
          f"{'invocation tail s':>18} {'naive -u|grep s':>16}")
    for round_no, lines, module_s, found, direct_s, naive_s in rows:
        print(f"{round_no:>5} {lines:>19} {module_s:>14.2f} {str(found):>10} {direct_s:>18.3f} "
              f"{naive_s:>16.3f}")
    print("sglang_info includes ansible's own start-up (~1-2 s); its journal work is the "
          "invocation tail plus one --grep over the current invocation only.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

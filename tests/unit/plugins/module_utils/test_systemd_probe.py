# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
import socket
import struct
from urllib.error import HTTPError, URLError

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _probe as probe
from ansible_collections.gpufleet.inference.plugins.module_utils import _systemd as sd

SHOW = """Id=sglang.service
LoadState=loaded
InvocationID=0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d
ActiveState=active
SubState=running
MainPID=4242
NRestarts=2
ControlGroup=/system.slice/sglang.service
ExecMainStartTimestamp=Sun 2026-11-29 10:00:00 UTC
Result=success
UnitFileState=enabled
"""
EXEC = ("ExecStart={ path=/opt/sglang/venv/bin/python ; argv[]=/opt/sglang/venv/bin/python -m sglang.launch_server "
        "--speculative-dflash-draft-window-size 2048 --speculative-num-draft-tokens=16 ; ignore_errors=no ; "
        "start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n")


def test_state(run_table):
    run_table.add(sd.show_argv("sglang.service", sd.STATE_PROPERTIES), out=SHOW)
    state = sd.Systemd(run_table, "sglang.service").state()
    assert state.exists and state.running and not state.crashed
    assert (state.invocation_id, state.main_pid, state.n_restarts) == ("0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d", 4242, 2)
    assert state.control_group == "/system.slice/sglang.service"
    assert run_table.calls[0][:3] == ["systemctl", "show", "sglang.service"]
    assert "InvocationID" in run_table.calls[0][-1]


@pytest.mark.parametrize("active,sub,running,crashed", [
    ("activating", "start", True, False), ("failed", "failed", False, True), ("inactive", "dead", False, True),
    ("activating", "auto-restart", False, True), ("deactivating", "stop-sigterm", False, False),
])
def test_crashed_and_running(active, sub, running, crashed):
    state = sd.UnitState({"LoadState": "loaded", "ActiveState": active, "SubState": sub})
    assert (state.running, state.crashed) == (running, crashed)


def test_not_found_and_errors(run_table):
    assert not sd.UnitState({"LoadState": "not-found"}).exists
    run_table.add(sd.show_argv("x.service", sd.STATE_PROPERTIES), rc=1, err="Failed to connect to bus")
    with pytest.raises(sd.SystemdError, match="Failed to connect to bus"):
        sd.Systemd(run_table, "x.service").state()


def test_exec_start_and_flag_value(run_table):
    run_table.add(sd.show_argv("sglang.service", ("ExecStart",)), out=EXEC)
    argvs = sd.Systemd(run_table, "sglang.service").exec_start()
    assert argvs[0][:3] == ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"]
    assert sd.flag_value(argvs[0], "--speculative-dflash-draft-window-size") == (True, "2048")
    assert sd.flag_value(argvs[0], "--speculative-num-draft-tokens") == (True, "16")
    assert sd.flag_value(argvs[0], "--speculative-draft-window-size") == (False, None)
    assert sd.parse_exec_start("") == []


# --- HTTP ------------------------------------------------------------------------------------

class FakeResp(object):
    def __init__(self, status, body):
        self.status = status
        self.body = body

    def read(self):
        return self.body

    def getcode(self):
        return self.status


def opener_returning(outcome, calls=None):
    def opener(url, **kwargs):
        if calls is not None:
            calls.append((url, kwargs))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    return opener


def test_generate_posts_greedy_request_with_bearer_and_bounded_timeout():
    calls = []
    client = probe.HttpClient("http://127.0.0.1:30000/", "sekret", True,
                              opener_returning(FakeResp(200, b'{"text": " Paris", "meta_info": {"completion_tokens": 1}}'), calls))
    resp = client.generate("hi", 4, 2.5)
    assert probe.generate_verdict(resp) == (True, " Paris", {"completion_tokens": 1})
    url, kwargs = calls[0]
    assert url == "http://127.0.0.1:30000/generate"
    assert kwargs["method"] == "POST" and kwargs["timeout"] == 2.5
    assert kwargs["headers"]["Authorization"] == "Bearer sekret"
    assert '"temperature": 0' in kwargs["data"] and '"max_new_tokens": 4' in kwargs["data"]


@pytest.mark.parametrize("exc,kind", [
    (URLError(ConnectionRefusedError(111, "Connection refused")), probe.REFUSED),
    (ConnectionRefusedError(111, "Connection refused"), probe.REFUSED),
    (URLError(socket.timeout("timed out")), probe.TIMEOUT),
    (socket.timeout("timed out"), probe.TIMEOUT),
    (URLError("Name or service not known"), probe.ERROR),
])
def test_network_outcomes(exc, kind):
    resp = probe.HttpClient("http://h:1", opener=opener_returning(exc)).generate("x", 1, 1)
    assert resp.kind == kind
    assert resp.port_open == (kind == probe.TIMEOUT)


def test_http_error_status_and_empty_text():
    import io
    err = HTTPError("http://h:1/generate", 503, "Service Unavailable", {}, io.BytesIO(b'{"error": "starting"}'))
    resp = probe.HttpClient("http://h:1", opener=opener_returning(err)).generate("x", 1, 1)
    assert (resp.kind, resp.status, resp.port_open) == (probe.HTTP, 503, True)
    assert probe.generate_verdict(resp)[0] is False
    empty = probe.HttpClient("http://h:1", opener=opener_returning(FakeResp(200, b'{"text": ""}'))).generate("x", 1, 1)
    assert probe.generate_verdict(empty)[0] is False


def test_server_info_falls_back_to_old_path():
    import io
    calls = []

    def opener(url, **kwargs):
        calls.append(url)
        if url.endswith("/server_info") and "get_" not in url:
            raise HTTPError(url, 404, "nf", {}, io.BytesIO(b""))
        return FakeResp(200, b'{"version": "0.5.11"}')
    resp = probe.HttpClient("http://h:1", opener=opener).server_info(3)
    assert resp.json() == {"version": "0.5.11"}
    assert calls == ["http://h:1/server_info", "http://h:1/get_server_info"]


def test_server_info_subset():
    data = {"version": "0.5.11", "status": "Up", "tp_size": 8, "model_path": "/m", "mem_fraction_static": 0.8,
            "speculative_algorithm": "DFLASH", "speculative_dflash_draft_window_size": 2048,
            "internal_states": [{"avg_spec_accept_length": 3.1, "other": 1}]}
    subset = probe.server_info_subset(data)
    assert "mem_fraction_static" not in subset
    assert subset["speculative_dflash_draft_window_size"] == 2048
    assert subset["internal_states"] == [{"avg_spec_accept_length": 3.1}]


# --- provenance from a fake /proc ----------------------------------------------------------------

def hex4(address):
    return "%08X" % struct.unpack("=I", socket.inet_aton(address))[0]


def tcp_line(address_hex, port, inode, state="0A"):
    return "   0: %s:%04X 00000000:0000 %s 00000000:00000000 00:00000000 00000000     0        0 %s 1 0 0 10 0" % (
        address_hex, port, state, inode)


def make_proc(tmp_path, tcp=(), tcp6=(), procs=()):
    net = tmp_path / "proc" / "net"
    net.mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (net / "tcp").write_text(header + "\n".join(tcp) + "\n")
    (net / "tcp6").write_text(header + "\n".join(tcp6) + "\n")
    for pid, comm, cgroup, inodes, ppid in procs:
        base = tmp_path / "proc" / str(pid)
        (base / "fd").mkdir(parents=True)
        (base / "comm").write_text(comm + "\n")
        (base / "cgroup").write_text("0::%s\n" % cgroup)
        (base / "stat").write_text("%s (%s) S %s 1 1\n" % (pid, comm, ppid))
        for number, inode in enumerate(inodes):
            (base / "fd" / str(number + 3)).symlink_to("socket:[%s]" % inode)
    return str(tmp_path)


def resolver(host, port):
    return [host]


def test_listener_inside_unit(tmp_path):
    root = make_proc(tmp_path, tcp=[tcp_line(hex4("127.0.1.11"), 30000, 777), tcp_line(hex4("127.0.1.11"), 30000, 1, "01")],
                     procs=[(4242, "python3", "/system.slice/sglang.service", [777], 1)])
    result = probe.listener_provenance("127.0.1.11", 30000, "/system.slice/sglang.service", "sglang.service",
                                       main_pid=4242, root=root, resolver=resolver)
    assert result["verdict"] == "inside", result


def test_child_of_main_pid_in_sub_cgroup_is_inside(tmp_path):
    root = make_proc(tmp_path, tcp=[tcp_line(hex4("0.0.0.0"), 30000, 777)],
                     procs=[(4242, "python3", "/system.slice/sglang.service", [], 1),
                            (4300, "python3", "/system.slice/sglang.service/worker", [777], 4242)])
    result = probe.listener_provenance("127.0.1.11", 30000, "/system.slice/sglang.service", "sglang.service",
                                       main_pid=4242, root=root, resolver=resolver)
    assert result["verdict"] == "inside"


def test_listener_outside_unit_named(tmp_path):
    root = make_proc(tmp_path, tcp=[tcp_line(hex4("127.0.1.11"), 30000, 777)],
                     procs=[(123, "python3", "/system.slice/other.service", [777], 1)])
    result = probe.listener_provenance("127.0.1.11", 30000, "/system.slice/sglang.service", "sglang.service",
                                       root=root, resolver=resolver)
    assert result["verdict"] == "outside"
    assert result["message"].startswith(
        "a process outside sglang.service answers on 127.0.1.11:30000: pid 123 (python3) in /system.slice/other.service")


def test_wildcard_v6_listener_of_invisible_owner(tmp_path):
    root = make_proc(tmp_path, tcp6=["   0: %s:%04X 00000000000000000000000000000000:0000 0A 0:0 00:0 0 0 0 999 1" % (
        "0" * 32, 30000)], procs=[(4242, "python3", "/system.slice/sglang.service", [], 1)])
    result = probe.listener_provenance("127.0.1.11", 30000, "/system.slice/sglang.service", "sglang.service",
                                       root=root, resolver=resolver)
    assert result["verdict"] == "invisible"
    assert "not visible" in result["message"] and "outside sglang.service" in result["message"]


def test_other_address_or_port_is_not_ours(tmp_path):
    root = make_proc(tmp_path, tcp=[tcp_line(hex4("127.0.1.12"), 30000, 777), tcp_line(hex4("127.0.1.11"), 30001, 778)])
    result = probe.listener_provenance("127.0.1.11", 30000, "/x", "sglang.service", root=root, resolver=resolver)
    assert result["verdict"] == "none"


def test_stale_listener_in_unit_cgroup_not_child_of_main_pid(tmp_path):
    root = make_proc(tmp_path, tcp=[tcp_line(hex4("127.0.1.11"), 30000, 777)],
                     procs=[(4242, "python3", "/system.slice/sglang.service", [], 1),
                            (3000, "sglang::schedul", "/system.slice/sglang.service", [777], 1)])
    result = probe.listener_provenance("127.0.1.11", 30000, "/system.slice/sglang.service", "sglang.service",
                                       main_pid=4242, root=root, resolver=resolver)
    assert result["verdict"] == "stale"


def test_cgroup_v1_and_url_parsing(tmp_path):
    base = tmp_path / "proc" / "5"
    base.mkdir(parents=True)
    (base / "cgroup").write_text("12:pids:/x\n1:name=systemd:/system.slice/sglang.service\n")
    assert probe.read_cgroup(5, str(tmp_path)) == "/system.slice/sglang.service"
    assert probe.read_cgroup(6, str(tmp_path)) is None
    assert probe.url_host_port("http://127.0.1.11:30000/x") == ("127.0.1.11", 30000)
    assert probe.url_host_port("https://h") == ("h", 443)
    assert not probe.in_cgroup("/system.slice/sglang.service2", "/system.slice/sglang.service")

# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Server probes (/generate, /server_info, a TCP connect) and who owns the listening socket."""
import json
import socket

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _probe as probe
from ansible_collections.gpufleet.inference.plugins.module_utils._http import (ERROR, HTTP, REFUSED, TIMEOUT,
                                                                               HttpClient, Response)

from fakes import FakeProc, tcp_hex, tcp_line

CGROUP = "/system.slice/sglang.service"


class Transport(object):
    """An HttpClient transport answering from {path: Response}; records every request."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, method, url, payload, headers, timeout):
        self.calls.append({"method": method, "url": url, "payload": payload, "headers": headers, "timeout": timeout})
        for path, resp in self.answers.items():
            if url.endswith(path):
                return resp
        return Response(REFUSED, error="refused")


def client(answers, api_key=None):
    transport = Transport(answers)
    return HttpClient("http://127.0.1.11:30000", api_key, transport=transport), transport


def ok(body, status=200):
    return Response(HTTP, status, json.dumps(body))


# --------------------------------------------------------------------------- /generate

def test_generate_posts_a_greedy_request_with_bearer_and_timeout():
    http, transport = client({"/generate": ok({"text": " Paris", "meta_info": {"completion_tokens": 1}})}, "sekret")
    resp = probe.generate(http, "The capital of France is", 4, 2.5)
    assert probe.generate_verdict(resp) == (True, " Paris", {"completion_tokens": 1})
    call = transport.calls[0]
    assert (call["method"], call["url"], call["timeout"]) == ("POST", "http://127.0.1.11:30000/generate", 2.5)
    assert call["payload"] == {"text": "The capital of France is",
                               "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    assert call["headers"]["Authorization"] == "Bearer sekret"


@pytest.mark.parametrize("resp,verdict", [
    (ok({"text": " Paris"}), (True, " Paris", {})),
    (ok({"text": [" Paris", " Berlin"], "meta_info": {"x": 1}}), (True, " Paris", {"x": 1})),  # batched shape
    (ok({"text": "", "meta_info": {}}), (False, "", {})),
    (ok({"text": "   \n"}), (False, "   \n", {})),
    (ok({"text": []}), (False, None, {})),
    (ok({"text": None}), (False, None, {})),
    (ok({"text": 42}), (False, 42, {})),
    (ok({"text": " Paris", "meta_info": "not a dict"}), (True, " Paris", {})),
    (ok(["not", "a", "dict"]), (False, None, None)),
    (Response(HTTP, 200, "not json"), (False, None, None)),
    (ok({"text": " Paris"}, 201), (False, None, None)),  # only 200 passes
    (ok({"error": "starting"}, 503), (False, None, None)),
    (Response(REFUSED, error="refused"), (False, None, None)),
    (Response(TIMEOUT, error="timed out"), (False, None, None)),
    (Response(ERROR, error="boom"), (False, None, None)),
])
def test_generate_verdict(resp, verdict):
    assert probe.generate_verdict(resp) == verdict


# --------------------------------------------------------------------------- /server_info

def test_server_info_falls_back_to_the_deprecated_path_on_404():
    http, transport = client({"/get_server_info": ok({"version": "0.5.11"}),
                              "/server_info": Response(HTTP, 404, "Not Found")})
    resp = probe.server_info(http, 3)
    assert resp.json() == {"version": "0.5.11"}
    assert [call["url"] for call in transport.calls] == ["http://127.0.1.11:30000/server_info",
                                                         "http://127.0.1.11:30000/get_server_info"]
    assert all(call["method"] == "GET" and call["timeout"] == 3 for call in transport.calls)


@pytest.mark.parametrize("first", [ok({"version": "0.5.23"}), Response(HTTP, 401, "no"),
                                   Response(REFUSED, error="refused")])
def test_server_info_no_fallback_unless_404(first):
    http, transport = client({"/server_info": first})
    assert probe.server_info(http, 3) is first
    assert len(transport.calls) == 1


def test_server_info_subset_keeps_identity_speculative_keys_and_accept_length_only():
    data = {"version": "0.5.11", "status": "Up", "tp_size": 8, "dp_size": 1, "model_path": "/m", "host": "h",
            "port": 1, "mem_fraction_static": 0.8, "api_key": "sekret", "admin_api_key": "root-sekret",
            "speculative_algorithm": "DFLASH", "speculative_dflash_draft_window_size": 2048,
            "internal_states": [{"avg_spec_accept_length": 3.1, "other": 1, "api_key": "sekret"}, "junk"]}
    subset = probe.server_info_subset(data)
    assert subset == {"version": "0.5.11", "status": "Up", "tp_size": 8, "dp_size": 1, "model_path": "/m",
                      "host": "h", "port": 1, "speculative_algorithm": "DFLASH",
                      "speculative_dflash_draft_window_size": 2048,
                      "internal_states": [{"avg_spec_accept_length": 3.1}]}
    assert "sekret" not in json.dumps(subset)


@pytest.mark.parametrize("data", [None, [], "text", 3])
def test_server_info_subset_of_no_mapping(data):
    assert probe.server_info_subset(data) is None


def test_server_info_subset_without_internal_states_list():
    assert probe.server_info_subset({"internal_states": "x", "version": "1"}) == {"version": "1"}


# --------------------------------------------------------------------------- TCP connect

def test_port_accepts_against_a_real_loopback_socket():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert probe.port_accepts("127.0.0.1", port, timeout=1.0)
    finally:
        server.close()
    # the same port once closed: refused, not an exception
    assert not probe.port_accepts("127.0.0.1", port, timeout=1.0)


def test_port_accepts_never_raises_on_bad_input():
    assert not probe.port_accepts("127.0.0.1", 70000, timeout=0.5)  # not a port
    assert not probe.port_accepts("127.0.0.1", "x", timeout=0.5)
    assert not probe.port_accepts("no such host.invalid", 80, timeout=0.5)


def test_url_host_port():
    assert probe.url_host_port("http://127.0.1.11:30000/x") == ("127.0.1.11", 30000)
    assert probe.url_host_port("https://h") == ("h", 443)
    assert probe.url_host_port("http://h") == ("h", 80)
    assert probe.url_host_port("http://[::1]:30000") == ("::1", 30000)


def test_resolve_of_a_literal_and_of_nothing():
    assert probe.resolve("127.0.0.1", 30000) == ["127.0.0.1"]
    assert probe.resolve("no such host.invalid", 1) == []


# --------------------------------------------------------------------------- provenance, fake /proc

def resolver(host, port):
    return [host]


def provenance(fake, host="127.0.1.11", main_pid=4242, control_group=CGROUP, resolve=resolver):
    return probe.listener_provenance(host, 30000, control_group, "sglang.service", main_pid=main_pid, root=fake.root,
                                     resolver=resolve)


def test_listener_inside_unit(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp=[tcp_line(tcp_hex("127.0.1.11"), 30000, 777),
                                           tcp_line(tcp_hex("127.0.1.11"), 30000, 1, "01")])  # 01: established
    fake.process(4242, cgroup=CGROUP, inodes=[777])
    result = provenance(fake)
    assert result["verdict"] == "inside", result
    assert result["owners"] == [{"pid": 4242, "comm": "python3", "cgroup": CGROUP, "inode": "777"}]
    assert result["message"] == "127.0.1.11:30000 is served by pid 4242 in %s" % CGROUP


def test_child_of_main_pid_in_a_sub_cgroup_is_inside(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp=[tcp_line(tcp_hex("0.0.0.0"), 30000, 777)])
    fake.process(4242, cgroup=CGROUP).process(4300, cgroup=CGROUP + "/worker", ppid=4242, inodes=[777])
    assert provenance(fake)["verdict"] == "inside"


def test_grandchild_with_a_comm_containing_parentheses(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp=[tcp_line(tcp_hex("127.0.1.11"), 30000, 5)])
    fake.process(4242, cgroup=CGROUP).process(4300, comm="sglang::sch (x) y", cgroup=CGROUP, ppid=4242)
    fake.process(4400, comm="tokenizer) S 1", cgroup=CGROUP, ppid=4300, inodes=[5])
    assert probe.parent_pid(4400, fake.root) == 4300
    assert provenance(fake)["verdict"] == "inside"


def test_listener_outside_unit_named(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp=[tcp_line(tcp_hex("127.0.1.11"), 30000, 777)])
    fake.process(123, cgroup="/system.slice/other.service", inodes=[777])
    result = provenance(fake, main_pid=None)
    assert result["verdict"] == "outside"
    assert result["message"] == ("a process outside sglang.service answers on 127.0.1.11:30000: pid 123 (python3) in "
                                 "/system.slice/other.service (the unit's cgroup is %s)" % CGROUP)


def test_unknown_control_group_makes_every_owner_outside(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp=[tcp_line(tcp_hex("127.0.1.11"), 30000, 777)])
    fake.process(4242, cgroup=CGROUP, inodes=[777])
    result = provenance(fake, control_group="")
    assert result["verdict"] == "outside" and "the unit's cgroup is unknown" in result["message"]


def test_a_sibling_cgroup_with_a_common_prefix_is_outside(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp=[tcp_line(tcp_hex("127.0.1.11"), 30000, 777)])
    fake.process(77, cgroup=CGROUP + "2", inodes=[777])
    assert provenance(fake)["verdict"] == "outside"
    assert not probe.in_cgroup(CGROUP + "2", CGROUP)
    assert probe.in_cgroup(CGROUP, CGROUP + "/") and probe.in_cgroup(CGROUP + "/a/b", CGROUP)
    assert not probe.in_cgroup(None, CGROUP) and not probe.in_cgroup(CGROUP, None)


def test_wildcard_v6_listener_of_an_invisible_owner(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp6=[tcp_line("0" * 32, 30000, 999)])
    fake.process(4242, cgroup=CGROUP)
    result = provenance(fake)
    assert result["verdict"] == "invisible"
    assert "inode 999" in result["message"] and "not visible" in result["message"]
    assert "outside sglang.service" in result["message"]


def test_v4_mapped_v6_listener_is_found(tmp_path):
    mapped = probe._ipv6_hex("::ffff:127.0.1.11")
    fake = FakeProc(tmp_path).sockets(tcp6=[tcp_line(mapped, 30000, 31)])
    fake.process(4242, cgroup=CGROUP, inodes=[31])
    assert provenance(fake)["verdict"] == "inside"


def test_ipv6_literal_listener(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp6=[tcp_line(probe._ipv6_hex("fd00::11"), 30000, 40)])
    fake.process(4242, cgroup=CGROUP, inodes=[40])
    assert provenance(fake, host="fd00::11")["verdict"] == "inside"
    assert provenance(fake, host="fd00::12")["verdict"] == "none"


def test_other_address_port_or_state_is_not_ours(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp=[tcp_line(tcp_hex("127.0.1.12"), 30000, 777),
                                           tcp_line(tcp_hex("127.0.1.11"), 30001, 778),
                                           tcp_line(tcp_hex("127.0.1.11"), 30000, 779, "06")])  # TIME_WAIT
    result = provenance(fake)
    assert result["verdict"] == "none" and result["owners"] == []
    assert "nothing on this host listens on 127.0.1.11:30000" in result["message"]


def test_no_proc_net_at_all_is_none(tmp_path):
    assert provenance(FakeProc(tmp_path))["verdict"] == "none"


def test_resolver_gives_every_address_of_a_hostname(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp=[tcp_line(tcp_hex("10.0.0.7"), 30000, 7)])
    fake.process(4242, cgroup=CGROUP, inodes=[7])
    result = provenance(fake, host="gpu-b01", resolve=lambda host, port: ["10.0.0.7", "fd00::7"])
    assert result["verdict"] == "inside"
    # a name that does not resolve (DNS down) is no crash: only a wildcard listener can serve it
    assert provenance(fake, host="gpu-b01", resolve=lambda host, port: [])["verdict"] == "none"
    fake.sockets(tcp=[tcp_line(tcp_hex("0.0.0.0"), 30000, 7)])
    assert provenance(fake, host="gpu-b01", resolve=lambda host, port: [])["verdict"] == "inside"


def test_stale_listener_in_the_unit_cgroup_not_a_child_of_main_pid(tmp_path):
    fake = FakeProc(tmp_path).sockets(tcp=[tcp_line(tcp_hex("127.0.1.11"), 30000, 777)])
    fake.process(4242, cgroup=CGROUP).process(3000, comm="sglang::schedul", cgroup=CGROUP, inodes=[777])
    result = provenance(fake)
    assert result["verdict"] == "stale"
    assert "pid 3000 (sglang::schedul)" in result["message"] and "main process 4242" in result["message"]
    # without a main PID to hold it to, the same socket is inside
    assert provenance(fake, main_pid=None)["verdict"] == "inside"


def test_cgroup_v1_and_missing_files(tmp_path):
    fake = FakeProc(tmp_path)
    fake.process(5, cgroup_text="12:pids:/x\n1:name=systemd:%s\n" % CGROUP)
    fake.process(6, cgroup_text="garbage\n")
    fake.process(8, cgroup_text="1:name=systemd:/v1\n0::/v2\n")  # hybrid: the unified one wins
    assert probe.read_cgroup(5, fake.root) == CGROUP
    assert probe.read_cgroup(6, fake.root) is None
    assert probe.read_cgroup(7, fake.root) is None
    assert probe.read_cgroup(8, fake.root) == "/v2"
    assert probe.read_comm(7, fake.root) == "?"


def test_is_descendant_is_bounded_and_stops_at_init(tmp_path):
    fake = FakeProc(tmp_path)
    fake.process(10, ppid=11).process(11, ppid=10)  # a loop cannot hang it
    assert not probe.is_descendant(10, 4242, fake.root)
    assert probe.is_descendant(4242, 4242, fake.root)
    assert not probe.is_descendant(10, None, fake.root)
    assert not probe.is_descendant(99, 4242, fake.root)  # gone


def test_pids_for_inodes_without_proc(tmp_path):
    assert probe.pids_for_inodes(["1"], str(tmp_path / "nowhere")) == {"1": []}

# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Probe an SGLang server over HTTP and find which process owns its listening socket.

Private to this collection: no compatibility promise. No third-party libraries: HTTP goes
through the collection's HTTP client (_http); provenance reads /proc (root injectable).
"""
from __future__ import annotations

import os
import socket
import struct

from urllib.parse import urlsplit

from ansible_collections.gpufleet.inference.plugins.module_utils._http import HTTP


def generate(http, prompt, max_new_tokens, timeout):
    """POST /generate with greedy sampling (a Response)."""
    payload = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    return http.post("/generate", payload, timeout)


def server_info(http, timeout):
    """/server_info, or the deprecated /get_server_info on a 404."""
    resp = http.get("/server_info", timeout)
    if resp.kind == HTTP and resp.status == 404:
        resp = http.get("/get_server_info", timeout)
    return resp


def generate_verdict(resp):
    """(ok, text, meta_info) for a /generate response: ok = 200 with non-empty text."""
    if resp.kind != HTTP or resp.status != 200:
        return False, None, None
    data = resp.json()
    if not isinstance(data, dict):
        return False, None, None
    text = data.get("text")
    if isinstance(text, list):  # batched request shape
        text = text[0] if text else None
    meta = data.get("meta_info") if isinstance(data.get("meta_info"), dict) else {}
    return bool(isinstance(text, str) and text.strip()), text, meta


def port_accepts(host, port, timeout=1.0):
    """A TCP connect to host:port succeeds (cheap: no request, no process)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


SERVER_INFO_KEYS = ("version", "status", "model_path", "tp_size", "dp_size", "host", "port")


def server_info_subset(data):
    """The facts worth reporting from /server_info: identity, speculative_* and accept length."""
    if not isinstance(data, dict):
        return None
    subset = dict((key, data[key]) for key in SERVER_INFO_KEYS if key in data)
    for key, value in data.items():
        if key.startswith("speculative_"):
            subset[key] = value
    states = data.get("internal_states")
    if isinstance(states, list):
        subset["internal_states"] = [
            {"avg_spec_accept_length": state.get("avg_spec_accept_length")}
            for state in states if isinstance(state, dict)]
    return subset


# --- provenance: who listens on host:port ------------------------------------------------

def _ipv4_hex(address):
    """/proc/net/tcp prints the address as the host-order integer of the network bytes."""
    return "%08X" % struct.unpack("=I", socket.inet_aton(address))[0]


def _ipv6_hex(address):
    raw = socket.inet_pton(socket.AF_INET6, address)
    return "".join("%08X" % struct.unpack("=I", raw[i:i + 4])[0] for i in range(0, 16, 4))


WILDCARD_V4 = _ipv4_hex("0.0.0.0")
WILDCARD_V6 = _ipv6_hex("::")


def url_host_port(url):
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname, port


def resolve(host, port):
    """Addresses `host` resolves to (IPv4 and IPv6 text)."""
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted(set(info[4][0] for info in infos))


def _wanted_hex(addresses):
    """Hex forms (tcp and tcp6) that serve connections to `addresses`, incl. wildcards."""
    v4, v6 = set([WILDCARD_V4]), set([WILDCARD_V6])
    for address in addresses:
        try:
            if ":" in address:
                v6.add(_ipv6_hex(address.split("%")[0]))
            else:
                v4.add(_ipv4_hex(address))
                v6.add(_ipv6_hex("::ffff:" + address))
        except (OSError, ValueError):
            continue  # a name that did not resolve: only the wildcards can serve it
    return v4, v6


def listening_inodes(addresses, port, root="/"):
    """LISTEN sockets on address:port (or a wildcard) -> list of (address_hex, inode)."""
    v4, v6 = _wanted_hex(addresses)
    found = []
    for name, wanted in (("tcp", v4), ("tcp6", v6)):
        try:
            with open(os.path.join(root, "proc/net", name)) as handle:
                lines = handle.read().splitlines()[1:]
        except (IOError, OSError):
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":
                continue
            address, port_hex = fields[1].split(":")
            if int(port_hex, 16) == port and address.upper() in wanted:
                found.append((address.upper(), fields[9]))
    return found


def pids_for_inodes(inodes, root="/"):
    """PIDs (visible in this PID namespace) holding sockets with these inodes: {inode: [pid]}."""
    targets = dict(("socket:[%s]" % inode, inode) for inode in inodes)
    owners = dict((inode, []) for inode in inodes)
    proc = os.path.join(root, "proc")
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return owners
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if link in targets:
                owners[targets[link]].append(int(pid))
                break
    return owners


def read_cgroup(pid, root="/"):
    """The process's cgroup path (v2 unified, else the name=systemd v1 hierarchy)."""
    try:
        with open(os.path.join(root, "proc", str(pid), "cgroup")) as handle:
            lines = handle.read().splitlines()
    except (IOError, OSError):
        return None
    fallback = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            return parts[2]
        if parts[1] == "name=systemd":
            fallback = parts[2]
    return fallback


def read_comm(pid, root="/"):
    try:
        with open(os.path.join(root, "proc", str(pid), "comm")) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return "?"


def in_cgroup(path, control_group):
    if not path or not control_group:
        return False
    control_group = control_group.rstrip("/")
    return path == control_group or path.startswith(control_group + "/")


def listener_provenance(host, port, control_group, unit, main_pid=None, root="/", resolver=resolve):
    """Does the process listening on host:port belong to the unit's cgroup?

    Returns a dict: ``verdict`` (inside | outside | invisible | none), ``message``, ``owners``
    (list of {pid, comm, cgroup}); ``stale`` when the owner is in the unit's cgroup but is not
    `main_pid` or one of its descendants (a leftover of an earlier invocation). The lab hosts share the machine's network namespace but not
    its PID namespace: a LISTEN socket whose owner is not visible in /proc belongs to another
    container or to the machine, i.e. it is outside the unit too.
    """
    addresses = resolver(host, port) or [host]
    sockets = listening_inodes(addresses, port, root)
    where = ("[%s]:%s" if ":" in host else "%s:%s") % (host, port)
    if not sockets:
        return {"verdict": "none", "owners": [],
                "message": "nothing on this host listens on %s (no LISTEN socket in /proc/net/tcp or tcp6)" % where}
    owners_by_inode = pids_for_inodes([inode for dummy, inode in sockets], root)
    owners = []
    outside = []
    invisible = []
    for dummy, inode in sockets:
        pids = owners_by_inode.get(inode) or []
        if not pids:
            invisible.append(inode)
        for pid in pids:
            cgroup = read_cgroup(pid, root)
            owner = {"pid": pid, "comm": read_comm(pid, root), "cgroup": cgroup, "inode": inode}
            owners.append(owner)
            if not in_cgroup(cgroup, control_group):
                outside.append(owner)
    if outside:
        owner = outside[0]
        return {"verdict": "outside", "owners": owners,
                "message": "a process outside %s answers on %s: pid %s (%s) in %s (the unit's cgroup is %s)" % (
                    unit, where, owner["pid"], owner["comm"], owner["cgroup"], control_group or "unknown")}
    if invisible:
        return {"verdict": "invisible", "owners": owners,
                "message": "a process outside %s answers on %s: the owner of the listening socket (inode %s) is not "
                           "visible in this host's /proc (another container or the machine itself)" % (
                               unit, where, invisible[0])}
    if main_pid and not any(is_descendant(owner["pid"], main_pid, root) for owner in owners):
        owner = owners[0]
        return {"verdict": "stale", "owners": owners,
                "message": "pid %s (%s) answers on %s from %s's cgroup but is not the invocation's main process %s "
                           "or one of its children (a leftover of an earlier invocation?)" % (
                               owner["pid"], owner["comm"], where, unit, main_pid)}
    return {"verdict": "inside", "owners": owners,
            "message": "%s is served by pid %s in %s" % (where, owners[0]["pid"], owners[0]["cgroup"])}


def parent_pid(pid, root="/"):
    try:
        with open(os.path.join(root, "proc", str(pid), "stat")) as handle:
            stat = handle.read()
    except (IOError, OSError):
        return None
    # comm may contain spaces and parentheses: fields after the last ')' are fixed
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def is_descendant(pid, ancestor, root="/"):
    """pid is `ancestor` or one of its descendants (following PPid, bounded)."""
    if not ancestor:
        return False
    current = pid
    for dummy in range(64):
        if current == ancestor:
            return True
        if not current or current == 1:
            return False
        current = parent_pid(current, root)
    return False

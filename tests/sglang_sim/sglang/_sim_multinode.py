"""Multi-node serving in the simulator: ``--nnodes``, ``--node-rank``, ``--dist-init-addr``.

Simulator-only module. What it plays, as read in the 0.5.11-0.5.23 wheels (engine.py,
http_server.py, distributed/bootstrap.py, utils/network.py, utils/common.py, scheduler.py) and
run with the real torch 2.13 (TCPStore / gloo texts):

- Global TP rank 0 (the head's first scheduler) hosts the rendezvous store on the dist-init
  port; every other rank, on this node or another, joins it over TCP. Until all have joined
  the head's schedulers stay after ``Init parallel begin.`` and its port stays closed; after
  ``--dist-timeout`` (unset: NCCL's 600 s) the store gives up with torch's DistStoreError.
  A rank that finds no store gives up after the same timeout with DistNetworkError.
- Once formed, the group stays connected: the head pings every other rank (the scheduler's
  per-loop broadcast) and a closed or reset connection fails that scheduler with gloo's text.
  A rank that stops answering (SIGSTOP) stalls the head: ``/generate`` waits, ``/health``
  fails after SGLANG_HEALTH_CHECK_TIMEOUT (20 s).
- Node 0 serves HTTP (the simulator's normal launcher, with the group's hooks); nodes >= 1 run
  schedulers only, then the stand-in health server, and block until their schedulers exit.

Deviation: the real store listens on every address (``*:port``); here it binds the
dist-init host only, so lab hosts that share one network namespace can each run a head on
the same port.
"""
from __future__ import annotations

import errno
import ipaddress
import json
import mmap
import os
import random
import select
import signal
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang._sim_profile import at_least
from sglang.srt.entrypoints import http_server as server
from sglang.srt.utils.common import log, write_line

# torch.distributed's default for the NCCL backend (the simulator plays a CUDA host).
DEFAULT_DIST_TIMEOUT = 600
PING_SECONDS = 0.2
# A rank whose answer to the head's ping is older than this holds the group up.
STALL_SECONDS = 1.0
SHUTDOWN_WAIT_SECONDS = 2.0

GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
               "peer [{host}]:{port}. This is typically caused by a remote worker crashing. Check the logs "
               "of the remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f")
GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[{host}]:{port}: Connection reset by peer. This is typically caused by a remote worker "
              "hanging or bugs in the application. Check the logs of the remote worker before "
              "reporting an error. GLHF! \U0001f3d6\ufe0f")


class DistError(RuntimeError):
    __module__ = "torch.distributed"


class DistStoreError(DistError):
    __module__ = "torch.distributed"


class DistNetworkError(DistError):
    __module__ = "torch.distributed"


def _env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return float(default)


# ---------------------------------------------------------------- addresses (utils/network.py)

def _is_ipv6(host):
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def _parse_port(text):
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"Invalid port number: {text!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"Port out of range (0-65535): {port}")
    return port


def parse_address(addr):
    """NetworkAddress.parse: 'host:port' or '[v6]:port' -> (host, port), the real error texts."""
    if not addr:
        raise ValueError("Empty address string")
    if addr.startswith("["):
        close = addr.find("]")
        if close == -1:
            raise ValueError(f"Missing closing bracket in IPv6 address: {addr!r}")
        host = addr[1:close]
        if not _is_ipv6(host):
            raise ValueError(f"Invalid IPv6 address inside brackets: {host!r}")
        rest = addr[close + 1:]
        if not rest.startswith(":") or len(rest) < 2:
            raise ValueError(f"Expected ':port' after closing bracket, got: {rest!r}")
        return host, _parse_port(rest[1:])
    if ":" not in addr:
        raise ValueError(f"Missing port in address (expected host:port): {addr!r}")
    host, port_text = addr.rsplit(":", 1)
    if not host:
        raise ValueError(f"Empty host in address: {addr!r}")
    if ":" in host and _is_ipv6(host):
        raise ValueError(f"Bare IPv6 address without brackets is ambiguous: {addr!r}. "
                         f"Use [{host}]:{port_text} instead.")
    return host, _parse_port(port_text)


def host_port(host, port):
    """NetworkAddress.to_host_port_str: IPv6 in brackets."""
    return f"[{host}]:{port}" if _is_ipv6(host) else f"{host}:{port}"


def _family(host):
    return socket.AF_INET6 if _is_ipv6(host) else socket.AF_INET


def _source_address(own_host, store_host):
    """Connect from this node's own --host address (what the head then names), when it is one."""
    try:
        own = ipaddress.ip_address(own_host)
        store = ipaddress.ip_address(store_host)
    except ValueError:
        return None
    if own.is_unspecified or own.version != store.version or own.is_loopback != store.is_loopback:
        return None
    return (own_host, 0)


# ---------------------------------------------------------------- the group

class Group:
    """This node's view of the serving group; built in the main process before any fork."""

    def __init__(self, sa, layout):
        self.nnodes = layout.nnodes
        self.node_rank = layout.node_rank
        self.tp = layout.tp
        self.world = layout.tp * layout.pp
        self.layout = layout
        self.dist_init_addr = sa.dist_init_addr
        self.timeout = int(sa.dist_timeout) if sa.dist_timeout is not None else DEFAULT_DIST_TIMEOUT
        # Without --dist-init-addr each node uses its own --host and NCCL port (bootstrap.py).
        self.own_port = int(sa.nccl_port) if sa.nccl_port else random.randint(20000, 40000)
        self.own_host = sa.host or "127.0.0.1"
        # Ranks a node runs but the simulator does not fork (it forks at most 16) join with the
        # node's first scheduler, so the store still counts the real world size.
        self.unforked = max(0, layout.ranks_per_node - len(layout.ranks))
        # Shared with the head's rank-0 scheduler: byte 0 = every rank answers, then the time
        # the group last answered.
        self.state = mmap.mmap(-1, 9)
        self._write_state(True, time.time())
        self.control_read, self.control_write = os.pipe()

    def global_rank(self, rank):
        return self.tp * rank.pp_rank + rank.tp_rank

    def address(self):
        """Where the store listens (the scheduler parses it: a bad address fails there)."""
        if self.dist_init_addr is None:
            return self.own_host, self.own_port
        return parse_address(self.dist_init_addr)

    # -- state the head's main process reads
    def _write_state(self, answering, when):
        self.state.seek(0)
        self.state.write(struct.pack("=?d", answering, when))

    def answering(self):
        self.state.seek(0)
        return struct.unpack("=?d", self.state.read(9))

    def wait_serving(self):
        """A request waits while a rank does not answer (its collective would hang)."""
        while not self.answering()[0]:
            time.sleep(0.05)

    def wait_healthy(self):
        """/health's generation: True at once when every rank answers, else polled each second."""
        if self.answering()[0]:
            return True
        timeout = int(_env_float("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
        tic = time.time()
        while time.time() < tic + timeout:
            time.sleep(1)
            if self.answering()[0]:
                return True
        last = self.answering()[1]
        log("Health check failed. Server couldn't get a response from detokenizer for last "
            f"{timeout} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(last))}")
        return False

    def stop_schedulers(self, children):
        """0.5.19+: the ShutdownReq reaches every rank through rank 0; wait for the local ones."""
        try:
            os.write(self.control_write, b"S")
        except OSError:
            return
        deadline = time.monotonic() + SHUTDOWN_WAIT_SECONDS
        pending = set(children)
        while pending and time.monotonic() < deadline:
            for pid in list(pending):
                try:
                    done, _status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    pending.discard(pid)
            time.sleep(0.02)
        children[:] = [pid for pid in children if pid in pending]

    # -- in a scheduler process
    def join(self, rank, fail):
        """Rendezvous for one scheduler; returns its link to the group. Raises like torch."""
        os.close(self.control_write)
        host, port = self.address()
        ranks = [self.global_rank(rank)]
        if rank is self.layout.rank0:
            ranks += [-1] * self.unforked
        if self.global_rank(rank) == 0:
            return Store(self, host, port, len(ranks), fail)
        os.close(self.control_read)
        return Member(self, host, port, ranks, fail)


def _send(sock, data, lock):
    with lock:
        sock.sendall(data)


class Store:
    """Global rank 0: the rendezvous store, then the group's heartbeat (the per-loop broadcast)."""

    def __init__(self, group, host, port, own_count, fail):
        self.group = group
        self.fail = fail
        self.lock = threading.Lock()
        self.members = {}  # socket -> {"peer": (host, port), "ack": time, "loaded": bool}
        self.late = []
        self.loaded = threading.Event()
        try:
            self.listener = socket.socket(_family(host), socket.SOCK_STREAM)
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind((host, port))
            self.listener.listen(64)
        except OSError as exc:
            name = errno.errorcode.get(exc.errno, "UNKNOWN")
            raise DistNetworkError(
                "The server socket has failed to listen on any local network address. "
                f"port: {port}, useIpv6: {str(_is_ipv6(host)).lower()}, code: -{exc.errno}, "
                f"name: {name}, message: {(exc.strerror or str(exc)).lower()}")
        self._gather(own_count)
        threading.Thread(target=self._run, daemon=True).start()

    def _gather(self, joined):
        world = self.group.world
        timeout = self.group.timeout
        deadline = time.monotonic() + timeout + 1
        pending = {}
        while joined < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistStoreError(f"Timed out after {timeout + 1} seconds waiting for clients. "
                                     f"{joined}/{world} clients joined.")
            readable, _w, _x = select.select([self.listener, *pending], [], [], min(left, 0.5))
            for sock in readable:
                if sock is self.listener:
                    conn, peer = self.listener.accept()
                    pending[conn] = [peer, b""]
                    continue
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    del pending[sock]
                    sock.close()
                    continue
                pending[sock][1] += data
                buffer = pending[sock][1]
                if b"\n" in buffer:
                    line, _sep, _rest = buffer.partition(b"\n")
                    count = len(line.split()) - 1  # "J rank rank ...": ranks this member brings
                    joined += max(1, count)
                    self.members[sock] = {"peer": pending.pop(sock)[0], "ack": time.monotonic(),
                                          "loaded": False}
        for sock in self.members:
            _send(sock, b"G\n", self.lock)
        for sock in pending:  # connected but never joined: no place in this group
            self.late.append(sock)
        if not self.members:
            self.loaded.set()

    def wait_loaded(self):
        """Rank 0 reports ready only once every rank has loaded (the KV-cache all-reduce)."""
        self.loaded.wait()

    def _lost(self, sock, reset):
        peer = self.members[sock]["peer"]
        text = (GLOO_RESET if reset else GLOO_CLOSED).format(host=peer[0], port=peer[1])
        self.fail(RuntimeError(text))

    def _run(self):
        last_ping = 0.0
        control = self.group.control_read
        while True:
            now = time.monotonic()
            if now - last_ping >= PING_SECONDS:
                last_ping = now
                for sock in list(self.members):
                    try:
                        sock.send(b"P\n", socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        pass  # a stopped rank's buffer is full: it is already overdue
                    except OSError:
                        self._lost(sock, reset=True)
            watched = [self.listener, control, *self.members]
            readable, _w, _x = select.select(watched, [], [], PING_SECONDS / 2)
            for sock in readable:
                if sock is self.listener:
                    conn, _peer = self.listener.accept()
                    self.late.append(conn)  # the group is formed: a late rank waits forever
                    continue
                if sock == control:
                    if os.read(control, 1) == b"S":
                        self._shutdown()
                    continue
                try:
                    data = sock.recv(4096)
                except ConnectionResetError:
                    self._lost(sock, reset=True)
                    continue
                if not data:
                    self._lost(sock, reset=False)
                    continue
                member = self.members[sock]
                member["ack"] = time.monotonic()
                if b"L" in data:
                    member["loaded"] = True
                    if all(m["loaded"] for m in self.members.values()):
                        self.loaded.set()
            answering = all(time.monotonic() - m["ack"] < STALL_SECONDS for m in self.members.values())
            _previous, last = self.group.answering()
            self.group._write_state(answering, time.time() if answering else last)

    def _shutdown(self):
        for sock in self.members:
            try:
                _send(sock, b"S\n", self.lock)
            except OSError:
                pass
        os._exit(0)


class Member:
    """Every rank but global rank 0: joins the store, answers its pings, follows its shutdown."""

    def __init__(self, group, host, port, ranks, fail):
        self.fail = fail
        self.lock = threading.Lock()
        self.sock = self._connect(host, port, group.timeout, _source_address(group.own_host, host))
        self.sock.settimeout(None)
        self.peer = self.sock.getpeername()[:2]
        _send(self.sock, ("J " + " ".join(str(r) for r in ranks) + "\n").encode(), self.lock)
        buffer = b""
        while b"G" not in buffer:
            try:
                data = self.sock.recv(64)
            except ConnectionResetError:
                raise RuntimeError(GLOO_RESET.format(host=self.peer[0], port=self.peer[1]))
            if not data:
                raise RuntimeError(GLOO_CLOSED.format(host=self.peer[0], port=self.peer[1]))
            buffer += data
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def _connect(host, port, timeout, source):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return socket.create_connection((host, port), timeout=min(2.0, max(0.1, timeout)),
                                                source_address=source)
            except OSError:
                if time.monotonic() >= deadline:
                    raise DistNetworkError(f"The client socket has timed out after {timeout * 1000}ms "
                                           f"while trying to connect to ({host}, {port}).")
                time.sleep(0.1)

    def wait_loaded(self):
        _send(self.sock, b"L\n", self.lock)

    def _run(self):
        while True:
            try:
                data = self.sock.recv(4096)
            except ConnectionResetError:
                self.fail(RuntimeError(GLOO_RESET.format(host=self.peer[0], port=self.peer[1])))
                return
            if not data:
                self.fail(RuntimeError(GLOO_CLOSED.format(host=self.peer[0], port=self.peer[1])))
                return
            if b"S" in data:
                os._exit(0)  # handle_shutdown: the event loop ends, the process exits cleanly
            if b"P" in data:
                try:
                    _send(self.sock, b"A\n", self.lock)
                except OSError:
                    pass


# ---------------------------------------------------------------- node 0: the normal server, joined

class HeadLauncher(server.Launcher):
    """Node 0 of a group: the simulator's server, its schedulers joined with the other nodes."""

    def __init__(self, server_args):
        super().__init__(server_args)
        self.group = Group(self.sa, self.layout)
        self.engine.group = self.group
        self.dying = False

    def running_phase_sigquit(self, signum, frame):
        # A rank failed: serving stops at once, the process is gone a few seconds later
        # (measured on a real 2-node group: tests/sglang_sim/README.md).
        if self.dying:
            return
        self.dying = True
        log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        self.group._write_state(False, self.group.answering()[1])
        self.kill_children()
        time.sleep(_env_float("SGLANG_SIM_GROUP_EXIT_SECONDS", 5.0))
        os.kill(os.getpid(), signal.SIGKILL)

    def stop_schedulers(self):
        self.group.stop_schedulers(self.children)


# ---------------------------------------------------------------- nodes >= 1: schedulers only

class FollowerLauncher(server.Launcher):
    """Node >= 1: schedulers only; once they are ready, the stand-in health server; then block."""

    def __init__(self, server_args):
        super().__init__(server_args)
        self.group = Group(self.sa, self.layout)

    def run(self):
        self.log_server_args()
        signal.signal(signal.SIGQUIT, self.launch_phase_sigquit)
        start = time.monotonic()
        pipes = []
        for rank in self.layout.ranks:
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                try:
                    server.scheduler_main(self.sa, self.layout, rank, write_fd, self.faults,
                                          self.engine.load_seconds, start, self.group)
                finally:
                    os._exit(1)
            os.close(write_fd)
            self.children.append(pid)
            pipes.append(read_fd)
        self.wait_for_ready(pipes)
        if at_least("0.5.21"):
            signal.signal(signal.SIGTERM, self.on_follower_sigterm)
        StandInHealthServer(self.sa).start()
        self.block_until_schedulers_exit()
        sys.exit(0)

    def wait_for_ready(self, pipes):
        """_wait_for_scheduler_ready: a scheduler that dies before it is ready ends the launch."""
        waiting = dict(enumerate(pipes))
        while waiting:
            readable, _w, _x = select.select(list(waiting.values()), [], [], 5.0)
            for index, fd in list(waiting.items()):
                if fd not in readable:
                    continue
                if os.read(fd, 64):
                    os.close(fd)
                    del waiting[index]
                    continue
                _pid, status = os.waitpid(self.children[index], 0)
                raise RuntimeError(
                    f"Rank {index} scheduler died during initialization "
                    f"(exit code: {_exitcode(status)}). "
                    "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
                    "Run `dmesg -T | grep -i oom` to check.")

    def on_follower_sigterm(self, signum, frame):
        log(f"SIGTERM received on node_rank {self.layout.node_rank}; waiting for the rank-0 "
            "ShutdownReq broadcast to stop the schedulers.")

    def block_until_schedulers_exit(self):
        for pid in self.children:
            while True:
                try:
                    _pid, status = os.waitpid(pid, 0)
                    break
                except InterruptedError:
                    continue
            log(f"Scheduler or DataParallelController {pid} terminated with {_exitcode(status)}")
        self.children = []


def _exitcode(status):
    """multiprocessing's Process.exitcode: the exit status, or minus the killing signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class StandInHealthServer:
    """launch_dummy_health_check_server: /health, /health_generate, /ping answer 200, nothing else."""

    ROUTES = ("/health", "/health_generate", "/ping")

    def __init__(self, sa):
        self.host = sa.host or "127.0.0.1"
        self.port = int(sa.port)
        self.metrics = bool(sa.enable_metrics)

    def start(self):
        threading.Thread(target=self._serve, daemon=True, name="health-check-server").start()
        log(f"Dummy health check server started in background thread at {host_port(self.host, self.port)}")

    def _serve(self):
        routes = self.ROUTES + (("/metrics",) if self.metrics else ())

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "uvicorn"
            sys_version = ""

            def log_message(self, *args):  # uvicorn runs at log level warning: no access lines
                pass

            def _reply(self, status, body=b"", content_type="application/json", extra=()):
                self.send_response(status)
                if body:
                    self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                for key, value in extra:
                    self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self):
                path = self.path.split("?", 1)[0]
                if path not in routes:
                    return self._reply(404, json.dumps({"detail": "Not Found"}).encode())
                if self.command not in ("GET", "HEAD"):
                    return self._reply(405, json.dumps({"detail": "Method Not Allowed"}).encode(),
                                       extra=(("allow", "GET"),))
                if path == "/metrics":
                    return self._reply(200, b"# no scheduler metrics on this node\n",
                                       "text/plain; version=0.0.4; charset=utf-8")
                return self._reply(200)

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _route

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = _family(self.host)

            def handle_error(self, request, client_address):
                pass

        try:
            httpd = Server((self.host, self.port), Handler)
        except OSError as exc:
            write_line(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                       f"('{self.host}', {self.port}): {(exc.strerror or str(exc)).lower()}")
            log(f"Dummy health check server stopped at {host_port(self.host, self.port)}")
            return
        httpd.serve_forever(poll_interval=0.2)


def launcher_for(server_args):
    """The launcher of this node: the HTTP server on node 0, schedulers only elsewhere."""
    node_rank = int(server_args.effective("node_rank", 0) or 0)
    return HeadLauncher(server_args) if node_rank == 0 else FollowerLauncher(server_args)

"""Conformance of multi-node serving groups: the project and the simulator against the real SGLang 0.5.23.

What the real code can run here, on the CPU, is run:
(f) the launch checks: a group's per-node argv (plugins/module_utils/_groups.py) passes the real
    parser and check_server_args(); the project's group validation refuses exactly what the real
    launch checks refuse; real and simulator give the same preflight verdicts;
(g) the real SGLang rendezvous (``init_distributed_environment``, gloo on loopback) and its
    per-loop broadcast (``broadcast_pyobj``): its timeout and connection errors are the
    simulator's, line for line;
(h) read from the real source: the follower's and the head's multi-node log lines, the
    stand-in health server's routes, the rank layout and the address parser equal the
    simulator's.
GPUs, NCCL and the HTTP/uvicorn side of a launch are not installed here (README.md).
"""
import ast
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import cases
from conftest import SIM
from ansible_collections.gpufleet.inference.plugins.module_utils import _args, _groups

MODEL = cases.TARGET


def group_hostvars(**settings):
    """A 2-node group's hostvars built from the conformance settings (cases.base)."""
    common = cases.base(**settings)
    return {f"node-{rank}": dict(common, sglang_host=f"127.0.0.{rank + 1}", ansible_host=f"127.0.0.{rank + 1}",
                                 group_names=["gpu"], sglang_serving_group="g", sglang_node_rank=rank)
            for rank in range(2)}


def node_argv(hostvars, host):
    groups = _groups.serving_groups(hostvars)
    return _args.build_args(hostvars[host], cases.VERSION) + _groups.node_args(groups, host)


K26 = dict(sglang_tp_size=16, sglang_speculative_algorithm="DFLASH", sglang_speculative_draft_model_path=cases.DRAFT,
           sglang_speculative_num_draft_tokens=16, sglang_speculative_draft_window_size=2048)

# (id, settings of a 2-node group) whose launch checks the project and real SGLang must judge alike.
LAUNCH_SETTINGS = [
    ("tp16", {"sglang_tp_size": 16}),
    ("tp3", {"sglang_tp_size": 3}),
    ("tp1-pp2", {"sglang_tp_size": 1, "sglang_extra_args": {"--pp-size": 2}}),
    ("tp1-pp3", {"sglang_tp_size": 1, "sglang_extra_args": {"--pp-size": 3}}),
    ("dp2", {"sglang_tp_size": 2, "sglang_extra_args": {"--dp-size": 2}}),
    ("dp2-attention", {"sglang_tp_size": 2, "sglang_extra_args": {"--dp-size": 2, "--enable-dp-attention": True}}),
]

# Raw argv, without the project: what SGLang itself checks at launch, and does not.
RAW = ["--model-path", MODEL, "--tp-size", "2", "--nnodes", "2"]
RAW_CASES = [
    ("no-address", RAW),
    ("rank-beyond-nnodes", RAW + ["--node-rank", "5", "--dist-init-addr", "127.0.0.1:5000"]),
    ("address-without-port", RAW + ["--dist-init-addr", "nohost"]),  # parsed only in the scheduler
    ("nccl-init-addr-alias", RAW + ["--node-rank", "1", "--nccl-init-addr", "127.0.0.1:5000", "--dist-timeout", "9"]),
    ("tp-not-divisible", ["--model-path", MODEL, "--tp-size", "3", "--nnodes", "2"]),
    ("dp-across-nodes", RAW + ["--dp-size", "2"]),
]


def launch_cases():
    out = [("group-head", node_argv(group_hostvars(**K26), "node-0")),
           ("group-follower", node_argv(group_hostvars(**K26), "node-1"))]
    for case_id, settings in LAUNCH_SETTINGS:
        hostvars = group_hostvars(**settings)
        # Built without the group validation: the real launch checks judge these.
        args = _args.build_args(hostvars["node-1"], cases.VERSION) + [
            "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.0.1:50000"]
        out.append((case_id, args))
    return out + RAW_CASES


LAUNCH_CASES = launch_cases()


@pytest.fixture(scope="module")
def launch_runs(real, sim, models):
    everything = [cases.substitute(args, models) for _id, args in LAUNCH_CASES]
    real_run, sim_run = real.worker({"cases": everything}), sim.worker({"cases": everything})
    return {case_id: {"real": r, "sim": s} for (case_id, _a), r, s in
            zip(LAUNCH_CASES, real_run["checks"], sim_run["checks"])}


def brief(result):
    return {k: result.get(k) for k in ("ok", "stage", "error")}


# ------------------------------------------------------------------ (f) launch checks

@pytest.mark.parametrize("case_id", ["group-head", "group-follower"])
def test_the_group_node_argv_passes_the_real_parser_and_launch_checks(launch_runs, case_id):
    result = launch_runs[case_id]["real"]
    assert result["ok"], brief(result)
    assert "ServerArgs.check_server_args()" in result["checked"]


@pytest.mark.parametrize("case_id, settings", LAUNCH_SETTINGS, ids=[c for c, _s in LAUNCH_SETTINGS])
def test_the_project_refuses_exactly_what_the_real_launch_checks_refuse(launch_runs, case_id, settings):
    try:
        _groups.serving_groups(group_hostvars(**settings))
        project = True
    except _groups.GroupError:
        project = False
    real = launch_runs[case_id]["real"]
    assert real["ok"] == project, "project %s, real SGLang: %s" % ("accepts" if project else "refuses", brief(real))
    if not real["ok"]:
        assert real["stage"] == "resolve" and real["exception"] == "AssertionError", brief(real)


@pytest.mark.parametrize("case_id", [c for c, _a in LAUNCH_CASES])
def test_real_and_simulator_launch_checks_agree(launch_runs, case_id):
    real, sim = launch_runs[case_id]["real"], launch_runs[case_id]["sim"]
    assert brief(sim) == brief(real)
    assert "ServerArgs.check_server_args()" in sim["checked"] or not sim["ok"]


def test_the_real_parser_reads_the_multi_node_flags(real, sim, models):
    code = textwrap.dedent("""
        import json, sys
        from sglang.srt.server_args import prepare_server_args
        a = prepare_server_args(sys.argv[1:])
        print(json.dumps({k: getattr(a, k) for k in ("nnodes", "node_rank", "dist_init_addr", "dist_timeout")}))
    """)
    argv = cases.substitute(RAW_CASES[3][1], models)
    seen = {}
    for side in (real, sim):
        proc = side.run(["-c", code, *argv])
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[side.name] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(seen.values())[0] == {"nnodes": 2, "node_rank": 1, "dist_init_addr": "127.0.0.1:5000",
                                      "dist_timeout": 9}
    assert len({json.dumps(v) for v in seen.values()}) == 1, seen


# ------------------------------------------------------------------ (g) the real rendezvous

RENDEZVOUS = textwrap.dedent("""
    import sys, time
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.utils.common import broadcast_pyobj
    rank, address, timeout = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    try:
        ps.init_distributed_environment(backend="gloo", world_size=2, rank=rank, local_rank=0,
                                        distributed_init_method="tcp://" + address, timeout=timeout)
        print("FORMED", flush=True)
        group = ps.get_world_group().cpu_group
        while True:  # the scheduler's per-loop broadcast from rank 0
            broadcast_pyobj([] if rank == 0 else None, rank, group, src=0)
            time.sleep(0.005)
    except Exception as exc:
        kind = type(exc)
        name = kind.__name__ if kind.__module__ == "builtins" else kind.__module__ + "." + kind.__qualname__
        print("ERROR %s: %s" % (name, str(exc).splitlines()[0]), flush=True)
""")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(side, argv, env=None):
    out = open(os.devnull, "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([side.python, *argv], stdout=subprocess.PIPE, stderr=out, text=True,
                            env=dict(side.env, **(env or {})), cwd="/", start_new_session=True)
    proc.devnull = out
    return proc


def _finish(proc, timeout=120):
    try:
        out, _err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.devnull.close()
    return out


def _next_line(proc, timeout):
    ready, _w, _x = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else "(nothing within %s s)" % timeout


def _error_line(out):
    return next((line[len("ERROR "):] for line in out.splitlines() if line.startswith("ERROR ")), None)


def _sim_node(real_side, rank, address, timeout, models, host="127.0.0.1"):
    """The simulator's node `rank` of a 2-node group, alone."""
    env = dict(os.environ, PYTHONPATH=str(SIM), SGLANG_SIM_VERSION=cases.VERSION, SGLANG_SIM_LOAD_SECONDS="0.3",
               PYTHONWARNINGS="ignore")
    argv = ["-m", "sglang.launch_server", "--model-path", models[MODEL], "--tp-size", "2", "--host", host,
            "--port", str(_free_port()), "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", address,
            "--dist-timeout", str(timeout)]
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=60, check=False)


def _sim_exception(stderr):
    """The exception line of the simulator's `Scheduler hit an exception` traceback."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "Scheduler hit an exception" in line)
    return next(line for line in lines[start + 1:] if not line.startswith(" "))


@pytest.fixture(scope="module")
def rendezvous(real, models):
    """The real SGLang rendezvous, every case at once: a head alone, a follower alone, a group
    whose follower is killed, a group whose head is killed."""
    runs = {}
    alone = {"head": (0, f"127.0.0.1:{_free_port()}", 2), "follower": (1, f"127.0.0.1:{_free_port()}", 1)}
    procs = {name: _start(real, ["-c", RENDEZVOUS, str(rank), address, str(timeout)])
             for name, (rank, address, timeout) in alone.items()}
    pairs = {}
    for victim in (0, 1):
        address = f"127.0.0.1:{_free_port()}"
        pairs[victim] = [_start(real, ["-c", RENDEZVOUS, str(rank), address, "60"]) for rank in (0, 1)]
    for victim, pair in pairs.items():
        for proc in pair:  # both print FORMED first
            assert _next_line(proc, timeout=180) == "FORMED"
        time.sleep(0.5)
        os.killpg(pair[victim].pid, signal.SIGKILL)
        runs[f"survivor-of-{victim}"] = _error_line(_finish(pair[1 - victim]))
        _finish(pair[victim])
    for name, proc in procs.items():
        runs[name] = (alone[name], _error_line(_finish(proc)))
    return runs


def test_a_head_alone_times_out_with_the_real_text(rendezvous, real, models):
    (rank, address, timeout), real_error = rendezvous["head"]
    assert real_error == ("torch.distributed.DistStoreError: Timed out after %d seconds waiting for clients. "
                          "1/2 clients joined." % (timeout + 1))
    sim = _sim_node(real, rank, f"127.0.0.1:{_free_port()}", timeout, models)
    assert sim.returncode == -signal.SIGKILL
    assert _sim_exception(sim.stderr) == real_error


def test_a_follower_alone_times_out_with_the_real_text(rendezvous, real, models):
    (rank, address, timeout), real_error = rendezvous["follower"]
    assert real_error is not None and real_error.startswith("torch.distributed.DistNetworkError: ")
    sim = _sim_node(real, rank, address, timeout, models)  # nothing listens there either
    assert sim.returncode == -signal.SIGKILL
    assert _sim_exception(sim.stderr) == real_error


def _gloo_patterns():
    spec = _load_sim_multinode()
    return [re.escape(template).replace(re.escape("{host}"), r"[0-9a-f.:]+").replace(re.escape("{port}"), r"\d+")
            for template in (spec.GLOO_CLOSED, spec.GLOO_RESET)]


def _load_sim_multinode():
    sys.path.insert(0, str(SIM))
    try:
        os.environ.setdefault("SGLANG_SIM_VERSION", cases.VERSION)
        import sglang._sim_multinode as module  # the simulator package (stdlib only)
    finally:
        sys.path.remove(str(SIM))
    return module


@pytest.mark.parametrize("victim", [1, 0], ids=["follower-killed", "head-killed"])
def test_a_broken_group_fails_the_survivor_with_one_of_the_simulators_gloo_texts(rendezvous, victim):
    error = rendezvous[f"survivor-of-{victim}"]
    assert error is not None and error.startswith("RuntimeError: ")
    text = error[len("RuntimeError: "):]
    assert any(re.fullmatch(pattern, text) for pattern in _gloo_patterns()), text


# ------------------------------------------------------------------ (h) from the real source

def _package_dir(side):
    proc = side.run(["-c", "import importlib.util, os; "
                           "print(os.path.dirname(importlib.util.find_spec('sglang').origin))"])
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip())


def _parse(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"))


def _texts(paths):
    """Every string literal of `paths`; an f-string with each of its values rendered as '\\0'."""
    found = set()
    for path in paths:
        nodes = list(ast.walk(_parse(path)))
        parts = {id(part) for node in nodes if isinstance(node, ast.JoinedStr) for part in node.values}
        for node in nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
                found.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                found.add("".join(part.value if isinstance(part, ast.Constant) else "\0" for part in node.values))
    return found


def _template(text):
    """A real f-string rendering as a pattern: each value any text."""
    return ".+".join(re.escape(piece) for piece in text.split("\0"))


REAL_LINES = [
    ("srt/entrypoints/engine.py", "SIGTERM received on node_rank "),
    ("srt/entrypoints/engine.py", "Scheduler or DataParallelController "),
    ("srt/entrypoints/engine.py", "Received sigquit from a child process."),
    ("srt/entrypoints/engine.py", "Rank \0 scheduler died during initialization"),
    ("srt/utils/common.py", "Dummy health check server started in background thread at "),
    ("srt/distributed/bootstrap.py", "Init parallel begin."),
    ("srt/distributed/bootstrap.py", "Init parallel ends. elapsed="),
    ("srt/managers/tokenizer_manager.py", "SIGQUIT received. signum="),
    ("srt/entrypoints/http_server.py", "Health check failed. Server couldn't get a response from detokenizer"),
]


@pytest.mark.parametrize("path, start", REAL_LINES, ids=[start.split("\0")[0][:40] for _p, start in REAL_LINES])
def test_the_simulators_multi_node_lines_are_the_real_ones(real, sim, path, start):
    real_texts = [t for t in _texts([_package_dir(real) / path]) if t.startswith(start)]
    assert len(real_texts) == 1, real_texts
    pattern = _template(real_texts[0])
    sim_root = _package_dir(sim)
    sim_texts = _texts([sim_root / "_sim_multinode.py", sim_root / "srt" / "entrypoints" / "http_server.py"])
    # The simulator writes the real text, a value where the real one has a value.
    rendered = {t.replace("\0", "0") for t in sim_texts} | {re.sub(r"\{[^}]*\}", "0", t) for t in sim_texts}
    assert any(re.fullmatch(pattern, text, re.S) for text in rendered), (real_texts[0], pattern)


def _function(path, name):
    tree = _parse(path)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(path.read_text(encoding="utf-8"), node), node


def test_the_stand_in_health_server_has_the_real_routes(real):
    _source, node = _function(_package_dir(real) / "srt" / "utils" / "common.py", "launch_dummy_health_check_server")
    routes = sorted(deco.args[0].value for fn in ast.walk(node) if isinstance(fn, ast.AsyncFunctionDef)
                    for deco in fn.decorator_list if isinstance(deco, ast.Call) and deco.func.attr == "get")
    assert routes == sorted(_load_sim_multinode().StandInHealthServer.ROUTES)


def test_the_rank_layout_is_the_real_one(real, sim):
    source, _node = _function(_package_dir(real) / "srt" / "entrypoints" / "engine.py", "_calculate_rank_ranges")

    class Parallel:
        pass

    namespace = {"Tuple": tuple, "get_parallel": lambda: namespace["parallel"]}
    exec(compile(source.replace(" -> Tuple[range, range, int, int]", ""), "engine.py", "exec"), namespace)
    code = ("import json, sys\nfrom sglang.srt.entrypoints.http_server import node_rank_ranges\n"
            "print(json.dumps([[list(r) for r in node_rank_ranges(*c)] for c in json.loads(sys.argv[1])]))")
    grid = [(tp, pp, n, r) for tp in (1, 2, 8, 16) for pp in (1, 2, 4) for n in (1, 2, 4) for r in range(n)
            if (tp * pp) % n == 0]
    proc = sim.run(["-c", code, json.dumps(grid)])
    assert proc.returncode == 0, proc.stderr
    simulated = json.loads(proc.stdout)
    for (tp, pp, nnodes, node_rank), sim_ranges in zip(grid, simulated):
        parallel = Parallel()
        parallel.tp_size, parallel.pp_size, parallel.nnodes = tp, pp, nnodes
        namespace["parallel"] = parallel
        pp_range, tp_range, _pp_per_node, _tp_per_node = namespace["_calculate_rank_ranges"](node_rank)
        assert sim_ranges == [list(pp_range), list(tp_range)], (tp, pp, nnodes, node_rank)


ADDRESSES = ["127.0.0.1:50000", "gpu-a01.example.internal:50000", "[fd00::5]:50000", "[::1]:1", "nohost",
             "host:", "host:http", "host:70000", ":50000", "[::1", "[::1]", "[::1]x", "::1:5000", "[nohost]:1", ""]


def test_the_address_parser_is_the_real_one_and_reads_the_projects_addresses(real):
    groups = _groups.serving_groups({
        "a": {"group_names": ["g"], "sglang_serving_group": "g", "sglang_node_rank": 0, "sglang_host": "::",
              "ansible_host": "fd00::5", "sglang_tp_size": 2},
        "b": {"group_names": ["g"], "sglang_serving_group": "g", "sglang_node_rank": 1, "sglang_host": "::",
              "ansible_host": "fd00::6", "sglang_tp_size": 2}})
    project = groups["g"].dist_init_addr
    code = textwrap.dedent("""
        import json, sys
        from sglang.srt.utils.network import NetworkAddress
        out = []
        for addr in json.loads(sys.argv[1]):
            try:
                na = NetworkAddress.parse(addr)
                out.append([na.host, na.port])
            except ValueError as exc:
                out.append(str(exc))
        print(json.dumps(out))
    """)
    proc = real.run(["-c", code, json.dumps(ADDRESSES + [project])])
    assert proc.returncode == 0, proc.stderr[-2000:]
    real_results = json.loads(proc.stdout.strip().splitlines()[-1])
    module = _load_sim_multinode()
    sim_results = []
    for addr in ADDRESSES + [project]:
        try:
            sim_results.append(list(module.parse_address(addr)))
        except ValueError as exc:
            sim_results.append(str(exc))
    assert sim_results == real_results
    assert real_results[-1] == ["fd00::5", _groups.DEFAULT_DIST_INIT_PORT]

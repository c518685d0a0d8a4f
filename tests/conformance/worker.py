"""Runs inside the interpreter under test (the real SGLang venv, or the simulator's).

    python worker.py REQUEST.json RESPONSE.json

REQUEST: {"script": the preflight CHECK_SCRIPT source, "cases": [argv, ...], "flags": bool,
          "algorithms": [name, ...], "warm": [argv, ...] whose imports to warm,
          "api_key": [case index, the key its --config file should give SGLang]}.
RESPONSE: {"version", "checks": [result per case], "flags": [argparse actions],
           "algorithms": {name: known?}, "api_key": true/false (never the key)}.

SGLang is imported once; every case then runs the preflight's own ``check()`` in a forked
child, so each case starts from the same freshly-imported state (resolution writes process
state: environment variables, logging) at the cost of a fork instead of an import. With
"warm", the parent first runs a check of each such argv itself, for its imports (the
environment it changed is restored); the flag table and the algorithm names are read before
that, from a parent that imported SGLang only. The conformance tests compare these verdicts
with the preflight run as a module runs it (a fresh `python -c`), so the shortcut cannot hide
a difference.
"""
import argparse
import json
import os
import sys
import time
import traceback

CASE_TIMEOUT = 300


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, (set, frozenset, tuple, list)):
            return [_jsonable(v) for v in value]
        return repr(value)


def dump_flags():
    """Every argparse action of `sglang serve`, as SGLang builds its parser."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        kind = action.type
        out.append({
            "flags": list(action.option_strings),
            "dest": action.dest,
            "action": type(action).__name__,
            "nargs": action.nargs,
            "const": _jsonable(action.const),
            "default": _jsonable(action.default),
            "type": None if kind is None else getattr(kind, "__name__", repr(kind)),
            "choices": None if action.choices is None else sorted(str(c) for c in action.choices),
            "required": action.required,
        })
    return out


def known_algorithms(names):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    known = {}
    for name in names:
        try:
            SpeculativeAlgorithm.from_string(name)
            known[name] = True
        except Exception:  # the real code raises ValueError("Unknown speculative algorithm name")
            known[name] = False
    return known


def api_key_read(argv, expected):
    """Whether SGLang's parser ends with api_key == expected (never returns the key)."""
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(list(argv)).api_key == expected


def in_child(function, *args):
    """function(*args) in a forked child; its JSON result, or a crash record."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            result = function(*args)
        except BaseException as exc:  # noqa: B902 - report, do not die silently
            traceback.print_exc()
            result = {"ok": False, "stage": "crash", "error": "%s: %s" % (type(exc).__name__, exc)}
        data = json.dumps(result).encode()
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(write_fd)
    chunks = []
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
    status = os.waitpid(pid, 0)[1]
    if not chunks:
        return {"ok": False, "stage": "crash", "error": "child died (wait status %d)" % status}
    return json.loads(b"".join(chunks))


def warm(check, argv):
    """Run check(argv) in this process, for its imports; then undo what it left in os.environ.

    A check imports what its path through SGLang needs (hooks, model classes, parsers: most of
    a check's cost, mostly disk reads). Importing it here once lets every fork start past it.
    Resolution also writes os.environ (SGLang defaults of its own variables): restored, so
    each fork sees the environment a fresh process would.
    """
    environ = dict(os.environ)
    try:
        check(argv)
    except BaseException:  # noqa: B902 - only the imports matter here
        traceback.print_exc()
    finally:
        os.environ.clear()
        os.environ.update(environ)


def main(request_path, response_path):
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    preflight = {"__name__": "gpufleet_preflight"}
    exec(compile(request["script"], "<gpufleet preflight>", "exec"), preflight)
    preflight["_prepare_environment"]()
    response = {"checks": [], "flags": None, "algorithms": None, "version": None}
    try:
        import sglang

        response["version"] = str(sglang.__version__)
        preflight["_import_sglang"]()
    except BaseException:
        traceback.print_exc()  # every check below then reports the import failure itself
    if request.get("flags"):
        response["flags"] = in_child(dump_flags)
    if request.get("algorithms"):
        response["algorithms"] = in_child(known_algorithms, request["algorithms"])
    if request.get("api_key"):
        index, expected = request["api_key"]
        response["api_key"] = in_child(api_key_read, request["cases"][index], expected)
    for argv in request.get("warm", []):
        warm(preflight["check"], argv)
    for argv in request.get("cases", []):
        started = time.monotonic()
        result = in_child(preflight["check"], argv)
        result["seconds"] = round(time.monotonic() - started, 2)
        response["checks"].append(result)
    with open(response_path, "w", encoding="utf-8") as handle:
        json.dump(response, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

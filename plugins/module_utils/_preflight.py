# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: what SGLang's own launch checks, run on the managed host before any restart.

Two small scripts run ON THE HOST with the host's SGLang interpreter (``python -c SCRIPT``):

- ``VERSION_SCRIPT``: the installed SGLang version, from package metadata (``import sglang``
  costs seconds and hundreds of MB on a real install); only without metadata does it import.
- ``CHECK_SCRIPT``: runs what ``python -m sglang.launch_server`` runs before it needs a GPU,
  in launch order: plugins, ``prepare_server_args`` (argparse; on 0.5.11-0.5.18 also the
  ``ServerArgs.__post_init__`` checks), ``ServerArgs.resolve_once()`` (0.5.19+: where the
  DFLASH window/block checks live), ``check_server_args()``, the auto parser resolution. The GPUs
  are hidden from it (they belong to the running server): it never allocates GPU memory, never
  starts the server and never touches a port. What it cannot check is listed in its result.

Each script prints one line ``<MARKER> {json}`` on stdout; the parsers below read it and fall
back to the exit code and stderr when the script died before printing it. Nothing here
imports Ansible or SGLang: the module (or an action plugin) runs the argv and hands the output back.

Private to this collection: no compatibility promise.
"""
from __future__ import annotations

import json
import re

from ansible_collections.gpufleet.inference.plugins.module_utils._flags import CONFIG_FLAG

MARKER = "GPUFLEET_PREFLIGHT"

# The placeholder for secrets in anything a script or a parser returns.
REDACTED = "<redacted>"

VERSION_SCRIPT = r'''
import json, sys
MARKER = "GPUFLEET_PREFLIGHT"
result = {"version": None, "source": None, "error": None}
try:
    from importlib import metadata
    try:
        result["version"] = metadata.version("sglang")
        result["source"] = "metadata"
    except metadata.PackageNotFoundError:
        pass
except Exception as exc:  # a broken metadata store is not fatal: try the import
    result["error"] = "package metadata unreadable: %s" % (exc,)
if result["version"] is None:
    try:
        import sglang
        result["version"] = str(sglang.__version__)
        result["source"] = "import"
        result["error"] = "no package metadata for sglang; version read by importing it"
    except BaseException as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
sys.stdout.write(MARKER + " " + json.dumps(result) + "\n")
sys.exit(0 if result["version"] else 1)
'''

CHECK_SCRIPT = r'''
"""gpufleet.inference preflight: run SGLang's pre-GPU launch steps on an args list."""
import argparse, json, os, re, sys, traceback

MARKER = "GPUFLEET_PREFLIGHT"
REDACTED = "<redacted>"
SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password)", re.I)

UNCHECKED = [
    "GPU-dependent resolution: the GPUs are hidden from this check (CUDA_VISIBLE_DEVICES=''), so"
    " GPU memory capacity, compute capability and what SGLang derives from them"
    " (mem_fraction_static, chunked_prefill_size, cuda graph batch sizes, attention/sampling"
    " backends chosen by GPU) are resolved as on a host without a GPU",
    "launch environment setup (_set_envs_and_config): kernel package version checks"
    " (flashinfer_python, sglang-kernel), NCCL variables, ulimit, prometheus directory",
    "ports: --host/--port binding, NCCL, dist-init and ZMQ ports (PortArgs) are not probed;"
    " the running server holds them",
    "multi-node rendezvous (--nnodes, --dist-init-addr) is not contacted",
    "model loading: weights, tokenizer, KV cache, CUDA graphs and the draft runner (which"
    " logs the DFLASH config line) are not built; only the models' config.json is read",
    "GPU memory: whether the model, KV cache and draft fit in the GPUs",
]


def _prepare_environment():
    # The GPUs belong to the running server: hide them before torch is imported, so nothing
    # here can create a CUDA context (and allocate memory) on them.
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        os.environ[name] = ""
    # Like the unit (WorkingDirectory=/): no package is imported from the caller's cwd.
    while "" in sys.path:
        sys.path.remove("")


def _secrets(argv):
    found = []
    for index, arg in enumerate(argv):
        if arg == "--api-key" and index + 1 < len(argv):
            found.append(argv[index + 1])
        elif arg.startswith("--api-key="):
            found.append(arg.split("=", 1)[1])
    for index, arg in enumerate(argv):
        path = None
        if arg == "--config" and index + 1 < len(argv):
            path = argv[index + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        if not path:
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    match = re.match(r"\s*([A-Za-z0-9_-]+)\s*:\s*(.+?)\s*$", line)
                    if match and SECRET_KEY.search(match.group(1)):
                        found.append(match.group(2).strip("'\""))
        except OSError:
            pass
    return [s for s in found if s]


def _redact(text, secrets):
    text = str(text)
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return re.sub(r"(api[_-]?key['\"]?\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s,)]+)",
                  r"\1" + REDACTED, text, flags=re.I)


def _first_line(text):
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def _cause(exc):
    text = _first_line(exc)
    return text if text else type(exc).__name__


_REACHED = ["import"]


def _stage(result, stage):
    # Progress on stdout, so a process that dies without answering still says how far it got.
    result["stage"] = _REACHED[0] = stage
    sys.stdout.write("%s_STAGE %s\n" % (MARKER, stage))
    sys.stdout.flush()


def _import_sglang():
    from sglang.srt.server_args import prepare_server_args  # noqa: F401


def check(argv):
    argv = list(argv)
    secrets = _secrets(argv)
    result = {"ok": False, "stage": "import", "error": None, "exception": None,
              "checked": [], "unchecked": list(UNCHECKED)}
    _stage(result, "import")

    def fail(stage, exc, error=None):
        result.update(ok=False, stage=stage, exception=type(exc).__name__,
                      error=_redact(error or _cause(exc), secrets))
        return result

    try:
        _import_sglang()
        import sglang
        from sglang.srt import server_args as sa_module
    except BaseException as exc:
        return fail("import", exc)
    result["checked"].append("import sglang %s" % getattr(sglang, "__version__", "?"))
    _stage(result, "parse")

    if not any(a == "--device" or a.startswith("--device=") for a in argv):
        # The launch detects the GPUs; with them hidden, name the device they would give.
        argv += ["--device", "cuda"]
        result["checked"].append("--device cuda added (the GPUs are hidden; launch detects them)")

    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        load_plugins = None
    if load_plugins is not None:
        try:
            load_plugins()
        except BaseException as exc:
            return fail("import", exc)
        result["checked"].append("SGLang plugins loaded (sglang.srt.plugins.load_plugins)")

    ServerArgs = sa_module.ServerArgs
    resolves_at_launch = hasattr(ServerArgs, "resolve_once")
    # argparse prints its error and exits 2: keep its message (as printed) for the verdict.
    messages = []
    original_error = argparse.ArgumentParser.error

    def error(parser, message):
        messages.append("%s: error: %s" % (parser.prog, message))
        return original_error(parser, message)

    argparse.ArgumentParser.error = error
    try:
        server_args = sa_module.prepare_server_args(argv)
    except SystemExit as exc:
        return fail("parse", exc, messages[-1] if messages else "argparse exited with %s" % exc.code)
    except BaseException as exc:
        # After argparse, prepare_server_args builds ServerArgs; before 0.5.19 its
        # __post_init__ resolves and validates there.
        return fail("parse" if resolves_at_launch else "resolve", exc)
    finally:
        argparse.ArgumentParser.error = original_error
    if resolves_at_launch:
        result["checked"].append("argparse (prepare_server_args)")
    else:
        result["checked"].append("argparse and ServerArgs.__post_init__ (prepare_server_args)")
    _stage(result, "resolve")

    try:
        if resolves_at_launch:
            # launch_server.run_server seeds this before resolve_once() seals the record.
            if ((getattr(server_args, "smg_grpc_mode", False) or getattr(server_args, "grpc_mode", False))
                    and getattr(server_args, "tokenizer_path", "") is None):
                server_args.tokenizer_path = server_args.model_path
            server_args.resolve_once()
            result["checked"].append("ServerArgs.resolve_once()")
        if hasattr(server_args, "check_server_args"):
            server_args.check_server_args()
            result["checked"].append("ServerArgs.check_server_args()")
        else:
            result["unchecked"].append("check_server_args: not in this SGLang")
        try:
            from sglang.srt.parser.template_detection import resolve_auto_parsers
        except ImportError:
            resolve_auto_parsers = None
        if resolve_auto_parsers is not None:
            resolve_auto_parsers(server_args)
            result["checked"].append("auto reasoning/tool-call parser resolution")
        else:
            result["unchecked"].append("auto parser resolution: not separate in this SGLang")
    except BaseException as exc:
        return fail("resolve", exc)
    result.update(ok=True, error=None, exception=None)
    return result


def main(argv):
    _prepare_environment()
    try:
        result = check(argv)
    except BaseException as exc:  # a bug here must still answer in the protocol
        result = {"ok": False, "stage": _REACHED[0], "error": "preflight crashed: %s" % _cause(exc),
                  "exception": type(exc).__name__, "checked": [], "unchecked": list(UNCHECKED)}
        traceback.print_exc()
    sys.stdout.flush()
    sys.stdout.write("\n" + MARKER + " " + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''

_STAGES = ("import", "parse", "resolve")
_API_KEY_TEXT = re.compile(r"(api[_-]?key['\"]?\s*[=:]\s*)('[^']*'|\"[^\"]*\"|[^\s,)]+)", re.I)


def version_command(python):
    """argv that prints the SGLang version installed for `python` (no import if avoidable)."""
    return [python, "-c", VERSION_SCRIPT]


def check_command(python, args):
    """argv that runs SGLang's pre-GPU launch checks on `args` with the host's `python`."""
    return [python, "-c", CHECK_SCRIPT, *[str(a) for a in args]]


def _redact(text):
    return _API_KEY_TEXT.sub(r"\1" + REDACTED, text)


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _report(out):
    """The JSON the script printed after MARKER (the last such line), or None."""
    for line in reversed((out or "").splitlines()):
        if line.startswith(MARKER + " "):
            try:
                data = json.loads(line[len(MARKER) + 1:])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def _progress(out):
    """The last stage the script said it entered (its progress lines), or "import"."""
    stage = "import"
    for line in (out or "").splitlines():
        if line.startswith(MARKER + "_STAGE "):
            candidate = line.split(" ", 1)[1].strip()
            if candidate in _STAGES:
                stage = candidate
    return stage


def _died(rc, err):
    """One line saying how a script died before it could answer."""
    last = _redact(_last_line(err))
    if rc is not None and rc < 0:
        how = "killed by signal %d" % -rc
    else:
        how = "exit %s" % rc
    return "%s (%s)" % (last, how) if last else "no answer (%s)" % how


def parse_version_output(rc, out, err):
    """-> {"version", "source": "metadata"|"import"|None, "error"}."""
    report = _report(out)
    if report is None:
        return {"version": None, "source": None, "error": _died(rc, err)}
    version = report.get("version")
    source = report.get("source")
    return {"version": str(version) if version else None,
            "source": source if source in ("metadata", "import") else None,
            "error": report.get("error")}


def parse_check_output(rc, out, err):
    """-> {"ok", "stage", "error", "exception", "checked", "unchecked"}.

    `error` is one line, the cause first. A script that died without answering is a failure
    at the last stage its progress lines name ("import" when there are none).
    """
    report = _report(out)
    if report is None:
        return {"ok": False, "stage": _progress(out), "error": _died(rc, err),
                "exception": None, "checked": [], "unchecked": []}
    ok = report.get("ok") is True
    stage = report.get("stage") if report.get("stage") in _STAGES else "import"
    error = report.get("error")
    if ok and rc not in (0, None):
        ok, error = False, "preflight reported success but exited %s" % rc
    return {"ok": ok, "stage": stage,
            "error": None if ok else _redact(str(error or _died(rc, err))),
            "exception": None if ok else report.get("exception"),
            "checked": list(report.get("checked") or []),
            "unchecked": list(report.get("unchecked") or [])}


def without_config(args):
    """args without the ``--config FILE`` pair (the file holds the API key and may not be installed yet)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == CONFIG_FLAG:
            skip = True
            continue
        out.append(arg)
    return out


def command_environment(base, environment):
    """What a script runs with besides the host's own environment: `base` (the collection's command
    environment, _host.COMMAND_ENV) and the server's (sglang_environment), as text like the unit's."""
    env = dict(base)
    env.update(dict((str(key), str(value)) for key, value in (environment or {}).items()))
    return env


def preflight(execute, python, environment, args=None, version=None):
    """The preflight of one host: its SGLang version, then (with `args`) SGLang's own checks of them.

    ``execute(argv, environment) -> (rc, out, err)`` runs one argv on the host with `environment`
    added to its own (the module runs it with run_command; the rollout's compare action as one
    command through the task's connection, without building and sending the module). Returns what
    the module sglang_preflight returns: changed, version, version_source, with `args` checked and
    unchecked; on failure also failed and msg. A caller that detected the version already passes it
    (and its source): only the check runs then.
    """
    if version is None:
        version = parse_version_output(*execute(version_command(python), environment))
    result = dict(changed=False, version=version.get("version"), version_source=version.get("source"))
    if not version.get("version"):
        result.update(failed=True, msg="cannot tell which SGLang %s (sglang_python) has: %s. Point sglang_python at "
                      "the interpreter that has sglang installed, or set sglang_version." % (
                          python, version.get("error") or "no version found"))
        return result
    if args is None:
        return result
    check = parse_check_output(*execute(check_command(python, without_config(args)), environment))
    result.update(checked=check.get("checked") or [], unchecked=check.get("unchecked") or [])
    if not check.get("ok"):
        result.update(failed=True, msg="SGLang %s (%s) rejects the intended arguments (%s): %s. Nothing was changed." % (
            result["version"], python, check.get("stage") or "check", check.get("error") or "no error output"))
    return result


# Runs one argv on the host for an action plugin, through the task's connection as one shell command
# (no module payload): the argv and the environment come on stdin, never on a command line (the
# environment may hold tokens; a command line shows in `ps` and in Ansible's -vvv output). It runs
# under the interpreter it starts (sys.executable, argv[0] as the shell found it), with the environment
# in place before that interpreter starts (LD_LIBRARY_PATH, PYTHONPATH).
BOOTSTRAP = ("import json,os,sys;d=json.loads(sys.stdin.read());e=dict(os.environ);e.update(d['env']);"
             "os.execve(sys.executable,[sys.executable]+d['args'],e)")


def remote_input(argv, environment):
    """stdin for BOOTSTRAP run by argv[0]: the rest of argv and the environment to add."""
    return json.dumps({"args": [str(arg) for arg in argv[1:]],
                       "env": dict((str(key), str(value)) for key, value in (environment or {}).items())})

"""Dump the real SGLang CLI (argparse actions) and ServerArgs fields to JSON.

Maintainer tool for the simulator, not used at run time.  Usage (per release):
    pip download sglang==0.5.23 --no-deps -d /tmp/wheels
    mkdir -p /tmp/sgl523 && (cd /tmp/sgl523 && unzip -q /tmp/wheels/sglang-0.5.23-*.whl 'sglang/*')
    pip install msgspec --target /tmp/msgspec_t   # 0.5.20+ build ServerArgs with msgspec
    PYTHONPATH=/tmp/msgspec_t python3 -S extract_flags.py /tmp/sgl523 0.5.23 \
        > ../sglang/srt/profiles/0.5.23.json

Output: {"version", "flags": every argparse action (names, dest, action class,
type, default, choices, nargs, required), "fields": ServerArgs fields in
declaration order with their defaults}, one entry per line.  Third-party
imports of the real package (torch, msgspec, ...) are replaced by permissive
stubs so that only ``ServerArgs.add_cli_args`` has to run.  Choices built from
sets are dumped in a fixed order (the tool re-runs itself with
PYTHONHASHSEED=0).
"""
import abc
import argparse
import dataclasses
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types


_REAL_DUNDERS = {
    "__wrapped__", "__signature__", "__dataclass_fields__", "__origin__",
    "__args__", "__parameters__", "__isabstractmethod__", "__set_name__",
    "__get__", "__set__", "__delete__", "__fspath__", "__length_hint__",
    "__array__", "__dataclass_params__", "__annotations__", "__qualname__",
}


# Optional accelerator stacks whose presence SGLang probes with find_spec.
_ABSENT = {
    "torch_npu", "habana_frameworks", "intel_extension_for_pytorch", "torch_musa",
    "mlx", "vllm", "aiter",
    "torch_xla", "tpu_commons", "mindspore", "ray",
}


_ABSENT_ATTRS = {"npu", "hpu", "xpu", "musa", "mlu", "mps"}


class _StubBase:
    def __init_subclass__(cls, **kwargs):
        pass


class _StubMeta(abc.ABCMeta):
    def __new__(mcs, name, bases, ns, **kwargs):
        return super().__new__(mcs, name, bases, ns)

    def __init__(cls, name, bases, ns, **kwargs):
        super().__init__(name, bases, ns)

    def __getattr__(cls, name):
        if name in _REAL_DUNDERS or name in _ABSENT_ATTRS:
            raise AttributeError(name)
        return _make(name)

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _make("inst")

    def register(cls, *args, **kwargs):
        return args[-1] if args else None

    def __getitem__(cls, item):
        return cls

    def __setitem__(cls, key, value):
        pass

    def __contains__(cls, item):
        return False

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __bool__(cls):
        return False

    def __int__(cls):
        return 0

    def __index__(cls):
        return 0

    def __lt__(cls, o):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __hash__(cls):
        return id(cls)

    def __eq__(cls, o):
        return cls is o

    def __mro_entries__(cls, bases):
        return (cls,)


def _make(name):
    return _StubMeta(str(name), (_StubBase,), {})


class _StubModule(types.ModuleType):
    __path__ = []
    __version__ = "2.9.0"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") or name in _ABSENT_ATTRS:
            raise AttributeError(name)
        return _make(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top == "sglang" or top in _ABSENT:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        pass


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        if isinstance(value, (set, frozenset, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)


def main():
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable, "-S", os.path.abspath(__file__)] + sys.argv[1:], env)
    root = sys.argv[1]
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    sys.path.insert(0, root)
    sys.meta_path.append(_StubFinder())
    # Deep kernel modules that only feed constants to server_args.
    # (0.5.16-0.5.17 moved the module under sglang.kernels.)
    for name in ("sglang.srt.layers.attention.fla.chunk_delta_h",
                 "sglang.kernels.ops.attention.fla.chunk_delta_h"):
        fla = types.ModuleType(name)
        fla.CHUNK_SIZE = 64
        sys.modules[name] = fla
    dill = types.ModuleType("dill")
    dill.dumps = lambda *a, **k: b""
    dill.loads = lambda *a, **k: None
    sys.modules.setdefault("dill", dill)
    from sglang.srt.server_args import ServerArgs  # noqa: E402

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    flags = []
    for act in parser._actions:
        if isinstance(act, argparse._HelpAction):
            continue
        typ = act.type
        tname = None
        if typ is not None:
            tname = getattr(typ, "__name__", repr(typ))
        flags.append(
            {
                "flags": act.option_strings,
                "dest": act.dest,
                "action": type(act).__name__,
                "nargs": act.nargs,
                "const": _jsonable(act.const),
                "default": _jsonable(act.default),
                "type": tname,
                "choices": _jsonable(list(act.choices)) if act.choices is not None else None,
                "required": act.required,
            }
        )
        # Parameters of SGLang's own actions (Deprecated*Action, LoRAPathAction).
        for attr in ("new_flag", "error_message", "const_value"):
            if getattr(act, attr, None) is not None:
                flags[-1][attr] = _jsonable(getattr(act, attr))
    version = sys.argv[2] if len(sys.argv) > 2 else None
    _dump({"version": version, "flags": flags, "fields": _fields(ServerArgs)})


def _fields(cls):
    """ServerArgs fields in declaration order (dataclass, or msgspec Struct in 0.5.20+)."""
    out = []
    if dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            if field.default is not dataclasses.MISSING:
                default = field.default
            elif field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            else:
                default = None  # required (model_path)
            out.append({"name": field.name, "default": _jsonable(default)})
        return out
    import msgspec  # noqa: E402

    for field in msgspec.structs.fields(cls):
        if field.default is not msgspec.NODEFAULT:
            default = field.default
        elif field.default_factory is not msgspec.NODEFAULT:
            default = field.default_factory()
        else:
            default = None
        out.append({"name": field.name, "default": _jsonable(default)})
    return out


def _dump(doc):
    """JSON with one flag / field per line, so that diffs between releases read well."""
    lines = ["{"]
    lines.append('"version": %s,' % json.dumps(doc["version"]))
    for key in ("flags", "fields"):
        items = [json.dumps(item, sort_keys=True) for item in doc[key]]
        lines.append('"%s": [' % key)
        lines.append(",\n".join(items))
        lines.append("]," if key == "flags" else "]")
    lines.append("}")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

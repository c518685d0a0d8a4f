"""Stand-in for torchvision in the conformance venv (see tests/conformance/README.md).

No torchvision build matches the CPU torch 2.13.0 available here (PyPI's fails to import beside
it: "operator torchvision::nms does not exist"). SGLang 0.5.23 imports torchvision at module
level only for multimodal preprocessing (e.g. sglang/srt/multimodal/internvl_utils.py), which
argument parsing and resolution never call. Every module and attribute here is a placeholder
class; calling anything returns None.
"""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+gpufleet.stub"
__path__ = []  # a package: submodules come from the finder below


class _Placeholder(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)


def _placeholder(name):
    return _Placeholder(str(name), (), {"__init__": lambda self, *a, **k: None,
                                        "__call__": lambda self, *a, **k: None})


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every `torchvision.*` import with a placeholder module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder(name)

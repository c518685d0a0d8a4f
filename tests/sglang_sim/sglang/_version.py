from sglang.version import __version__, __version_tuple__  # noqa: F401

version = __version__
version_tuple = __version_tuple__
commit_id = __commit_id__ = None

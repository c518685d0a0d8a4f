from sglang._sim_profile import selected_version, version_tuple

__version__ = selected_version()
__version_tuple__ = version_tuple(__version__)

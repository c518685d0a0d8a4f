"""Where releases up to 0.5.18 keep the ``--config`` merger (moved to sglang.srt.utils in 0.5.19)."""
from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger  # noqa: F401  # pylint: disable=unused-import

__all__ = ["ConfigArgumentMerger"]

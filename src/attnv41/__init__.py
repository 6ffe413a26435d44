"""attnv41: DeepSeek-V4.1 ("CSA2") attention for inference engines.

Public API: the geometry (`AttnV41Cfg`, `LayerRole`, `v41_flash`) and the reference
implementation (`attnv41.reference`). The fast runtime `AttnV41` lands in later work.
"""

from .config import AttnV41Cfg, LayerRole, v41_flash

__all__ = ["AttnV41Cfg", "LayerRole", "v41_flash", "__version__"]
__version__ = "0.1.0"

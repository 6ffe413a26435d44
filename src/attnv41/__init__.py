"""attnv41: DeepSeek-V4.1 ("CSA2") attention for inference engines.

Public API: the geometry (`AttnV41Cfg`, `LayerRole`, `v41_flash`), the runtime
(`AttnV41`, `AttnV41Run`), its weights and state (`AttnV41LayerWeights`,
`AttnV41LayerState`, `SharedV41`). The plain-PyTorch reference is `attnv41.reference`.
"""

from .config import AttnV41Cfg, LayerRole, v41_flash
from .runtime import AttnV41, AttnV41Run
from .state import AttnV41LayerState, SharedV41
from .weights import AttnV41LayerWeights

__all__ = [
    "AttnV41",
    "AttnV41Cfg",
    "AttnV41LayerState",
    "AttnV41LayerWeights",
    "AttnV41Run",
    "LayerRole",
    "SharedV41",
    "v41_flash",
    "__version__",
]
__version__ = "0.1.0"

"""The fast runtime: `AttnV41` (tables, workspaces, forward) and a layer-stack driver."""

from .attn import AttnV41, AttnV41Run
from .plan import DecodePlan, bucket_of
from .stack import RuntimeStack

__all__ = ["AttnV41", "AttnV41Run", "DecodePlan", "RuntimeStack", "bucket_of"]

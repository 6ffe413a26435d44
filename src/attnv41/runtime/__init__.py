"""The fast runtime: `AttnV41` (tables, workspaces, forward) and a layer-stack driver."""

from .attn import AttnV41, AttnV41Run
from .batch import BatchStep, BatchV41, SeqPool
from .batch_graphs import BatchGraphs
from .plan import DecodePlan, bucket_of
from .stack import RuntimeStack

__all__ = [
    "AttnV41",
    "AttnV41Run",
    "BatchGraphs",
    "BatchStep",
    "BatchV41",
    "DecodePlan",
    "RuntimeStack",
    "SeqPool",
    "bucket_of",
]

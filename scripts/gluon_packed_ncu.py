"""One call of the Gluon attention over packed rows at Flash shapes (a target for Nsight
Compute: `ncu --kernel-name regex:_attn_gl ... python3 scripts/gluon_packed_ncu.py '{"nsplit": 2}'`)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
from gluon_attn_probe import inputs  # noqa: E402

from attnv41.kernels.sparse_attn_gluon import sparse_attn_gluon  # noqa: E402

B = int(os.environ.get("B", "64"))
tune = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
q, win, comp, sel, offset, sink, _ = inputs(B, packed=True)
for _ in range(2):
    sparse_attn_gluon(q, win, comp, sel, offset, sink, 512**-0.5, **tune)
torch.cuda.synchronize()

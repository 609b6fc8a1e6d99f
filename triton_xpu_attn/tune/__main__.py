"""``python -m triton_xpu_attn.tune``: tune this device's kernel configs (see :mod:`.tuner`)."""
import sys

import triton_xpu_attn  # noqa: F401  (selects the backend first and registers every op)
from triton_xpu_attn.tune.tuner import main

sys.exit(main())

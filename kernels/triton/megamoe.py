"""Our fused MoE kernel (MegaMoE on Hopper) in Triton, with the combine in its epilogue.

The kernel lives in the package (src/xstage_bench/megamoe/kernel.py), so that the
installed harness imports it like any other module; this file re-exports it where the
project keeps its kernel sources. The tile schedules it runs are in
src/xstage_bench/megamoe/schedule.py.
"""

from xstage_bench.megamoe.kernel import launch  # noqa: F401
from xstage_bench.megamoe.schedule import SCHEDULES, build  # noqa: F401

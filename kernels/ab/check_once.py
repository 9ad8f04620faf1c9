"""Check each selected configuration once per value of a launch option: a short run to
profile (Nsight Compute around it sees one launch of our kernel per check).

    PYTHONPATH=src:kernels ncu --kernel-name _fused_moe_ws --launch-count 2 \
        python3 kernels/ab/check_once.py --config config/reference-h200x1.yaml --dataset ab \
        --shapes deepseek-v4-flash --precisions w8a8 --routings balanced --tokens 16384 \
        --option ROW_BOX_MIN=128,32

Each check is our measurer's (outputs poisoned, fresh inputs, the sampled tokens against
the reference), so a profiled launch is one whose output was checked.
"""

import sys

import one_gpu  # this folder

from xstage_bench.megamoe.kernel_ab import parse_option
from xstage_kernels import megamoe_ws


def main(argv) -> None:
    option, values = None, [None]
    if "--option" in argv:
        at = argv.index("--option")
        option, values = parse_option(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    for measurer, point, _ in one_gpu.configurations(argv, __doc__):
        for value in values:
            if option is not None:
                setattr(megamoe_ws, option, value)
            error, facts = measurer.check(point)
            print(f"{point['id']} {option}={value} check={error or 'ok'} {facts}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

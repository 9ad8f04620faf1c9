"""How much of our layer's kernel_us is the GPU waiting for the host to enqueue it.

    PYTHONPATH=src:kernels python3 kernels/ab/launch_gap.py --config config/reference-h200x1.yaml \
        --dataset ab --shapes deepseek-v4-flash --precisions w8a8 --routings balanced --tokens 1024

Each configuration (expert waves, every combine row local) is checked, then timed as the
harness timed it before its CUDA graphs and host lead (L2 flush, start event, the eager
MoEProblem.forward, end event) and, alternating
with that, with a sleep kernel enqueued after the flush, so that the GPU is still busy while
the host enqueues the layer and starts it the moment its turn comes. The difference is the
GPU's idle wait for the host inside the timed region. A development record, not a dataset.
"""

import statistics
import sys

import one_gpu  # this folder

SLEEP_CYCLES = 4_000_000  # about 2 ms at 1.98 GHz: longer than the host's enqueue
WARMUP, ROUNDS = 3, 15


def main(argv) -> None:
    for measurer, point, flush in one_gpu.configurations(argv, __doc__):
        error, _ = measurer.check(point)
        prob = measurer.problem(point)
        key = prob.arm(point)

        def forward(kernel_events, prob=prob, key=key):
            prob.forward(key, kernel_events=kernel_events, eager=True)

        runs = {0: [], SLEEP_CYCLES: []}
        for n in range(WARMUP + ROUNDS):
            for cycles, samples in runs.items():
                sample = one_gpu.timed_once(forward, flush, cycles)
                if n >= WARMUP:
                    samples.append(sample)
        idle, busy = ([statistics.median(s[i] for s in runs[c]) for i in range(3)] for c in runs)
        print(
            f"{point['id']} check={error or 'ok'} | as timed: time {idle[0]:.1f} kernel "
            f"{idle[1]:.1f} host-enqueue {idle[2]:.1f} us | GPU busy during enqueue: time "
            f"{busy[0]:.1f} kernel {busy[1]:.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])

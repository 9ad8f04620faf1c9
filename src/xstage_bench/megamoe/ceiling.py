"""What one GPU could do with a MegaMoE configuration: the GEMM ceiling and a roofline.

A configuration's TFLOP/s means little without the machine's own ceiling beside it. The
ceiling is cuBLAS on the same two GEMMs a rank computes (Linear-1: rows x 2I x H,
Linear-2: rows x H x I, rows = T * topk, a rank's mean share under expert parallelism):
`torch._scaled_mm` with row-wise FP8 scales for the FP8 precisions (the fastest FP8 GEMM
torch has on Hopper), bf16 for bf16. The roofline time is the larger of the useful FLOPs
at that ceiling and the bytes a rank must move through HBM at the measured copy bandwidth
(its experts' weights once, activations in, the intermediate out and back, outputs out):
small-token configurations are bound by the weights, not by the tensor cores.
"""

from __future__ import annotations

import statistics

CHECK_TOLERANCE = 1e-2  # cuBLAS against the fp32 product of its own operands
HBM_PROBE_BYTES = 1 << 30  # one device-to-device copy of this size measures HBM bandwidth
WEIGHT_BYTES = {"bf16": 2.0, "w8a8": 1.0, "w4a8": 0.5}  # per weight element as stored
ACT_BYTES = {"bf16": 2, "w8a8": 1, "w4a8": 1}  # per activation / intermediate element


def rank_rows(point: dict) -> int:
    """Rows a rank computes on average: each of its T tokens picks topk experts."""
    return point["tokens_per_rank"] * point["topk"]


def gemm_shapes(point: dict) -> list[tuple[int, int, int]]:
    """(M, N, K) of Linear-1 and Linear-2 on one rank."""
    rows, H, I = rank_rows(point), point["H"], point["I"]  # noqa: E741
    return [(rows, 2 * I, H), (rows, H, I)]


def useful_flops(point: dict) -> float:
    return float(sum(2 * m * n * k for m, n, k in gemm_shapes(point)))


def weight_bytes(point: dict) -> float:
    """One rank's E/P experts' weights (both linears) as stored."""
    experts = point["E"] / point["world_size"]
    return experts * 3 * point["H"] * point["I"] * WEIGHT_BYTES[point["precision"]]


def hbm_bytes(point: dict) -> float:
    """Bytes one rank moves through HBM at the least: its E/P experts' weights once, the
    received activations, the intermediate (written and read back) and the bf16 output."""
    H, I = point["H"], point["I"]  # noqa: E741
    rows, act = rank_rows(point), ACT_BYTES[point["precision"]]
    return weight_bytes(point) + rows * H * act + 2 * rows * I * act + rows * H * 2


def roofline_us(point: dict, ceiling_tflops: float, hbm_gbs: float) -> float:
    """The larger of compute at the ceiling and the HBM bytes at the copy bandwidth."""
    compute = useful_flops(point) / (ceiling_tflops * 1e6)
    memory = hbm_bytes(point) / (hbm_gbs * 1e3)
    return max(compute, memory)


def _operands(torch, m: int, n: int, k: int, precision: str, device):
    """(the GEMM call on seeded random operands in the ceiling's format, a function giving
    those operands dequantized to fp32, for the check)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(m * 31 + n * 7 + k)
    a = torch.randn(m, k, generator=gen, device=device)
    b = torch.randn(n, k, generator=gen, device=device)
    if precision == "bf16":
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
        return lambda: torch.mm(a, b.t()), lambda: (a.float(), b.float())
    sa = a.abs().amax(1, keepdim=True) / 448
    sb = b.abs().amax(1, keepdim=True).t() / 448
    a8 = (a / sa).to(torch.float8_e4m3fn)
    b8 = (b / sb.t()).to(torch.float8_e4m3fn)
    return (
        lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
        lambda: (a8.float() * sa, b8.float() * sb.t()),
    )


def check_gemm(torch, precision: str, device) -> float:
    """Relative error of the ceiling's GEMM call against the fp32 product of the same
    (dequantized) operands, on a small problem: the ceiling must compute, not just run."""
    call, dequantized = _operands(torch, 256, 512, 1024, precision, device)
    got = call().float()
    a, b = dequantized()
    want = a @ b.t()
    return float((got - want).norm() / want.norm())


def measure_hbm_gbs(torch, device, policy) -> float:
    """Device-to-device copy bandwidth (read + write bytes per second), GB/s."""
    from xstage_bench.measurement import timing

    src = torch.empty(HBM_PROBE_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    run = timing.cuda_event_timer(lambda: dst.copy_(src), device=device.index, flush_l2=False)
    us = statistics.median(timing.measure(run, policy))
    return 2 * HBM_PROBE_BYTES / (us * 1e3)


def measure_ceiling(torch, point: dict, device, policy, hbm_gbs: float) -> tuple[list, dict]:
    """(time samples in us of both GEMMs back to back, facts for the record)."""
    from xstage_bench.measurement import timing

    calls = [
        _operands(torch, m, n, k, point["precision"], device)[0] for m, n, k in gemm_shapes(point)
    ]
    lead = timing.host_lead(policy)
    run = timing.cuda_event_timer(
        lambda: [call() for call in calls],
        device=device.index,
        flush_l2=policy.flush_l2,
        lead=lead,
    )
    times = timing.measure(run, policy)
    median = statistics.median(times)
    ceiling = useful_flops(point) / (median * 1e6)
    facts = {
        "ceiling_gemm": "torch.mm bf16"
        if point["precision"] == "bf16"
        else "torch._scaled_mm FP8 row-wise",
        "gemm_shapes": [list(s) for s in gemm_shapes(point)],
        "tflops": ceiling,
        "hbm_gbs": hbm_gbs,
        "roofline_us": roofline_us(point, ceiling, hbm_gbs),
        "stop_reason": times.stop_reason,
        **timing.lead_facts(lead),
    }
    return list(times), facts

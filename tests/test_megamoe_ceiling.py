"""The GEMM ceiling and roofline of a MegaMoE configuration (megamoe/ceiling.py): the math."""

import pytest

from xstage_bench.megamoe import ceiling

FLASH = {"H": 4096, "I": 2048, "E": 256, "topk": 6, "world_size": 2, "precision": "w8a8"}


def test_gemm_shapes_are_a_ranks_two_linears():
    point = {**FLASH, "tokens_per_rank": 1024}
    assert ceiling.gemm_shapes(point) == [(6144, 4096, 4096), (6144, 4096, 2048)]
    assert ceiling.useful_flops(point) == 6 * 4096 * 2048 * 6144


def test_small_token_configurations_are_bound_by_the_weights():
    small = {**FLASH, "tokens_per_rank": 64}
    large = {**FLASH, "tokens_per_rank": 16384}
    # 128 experts of 3 * 4096 * 2048 FP8 bytes dominate at 64 tokens
    assert ceiling.hbm_bytes(small) == pytest.approx(128 * 3 * 4096 * 2048, rel=0.02)
    hbm, tflops = 4000.0, 1300.0
    memory_us = ceiling.hbm_bytes(small) / (hbm * 1e3)
    assert ceiling.roofline_us(small, tflops, hbm) == pytest.approx(memory_us)
    compute_us = ceiling.useful_flops(large) / (tflops * 1e6)
    assert ceiling.roofline_us(large, tflops, hbm) == pytest.approx(compute_us)


def test_weight_bytes_follow_the_stored_format():
    point = {**FLASH, "tokens_per_rank": 1}
    weights = {p: ceiling.hbm_bytes({**point, "precision": p}) for p in ("bf16", "w8a8", "w4a8")}
    assert weights["bf16"] / weights["w8a8"] == pytest.approx(2, rel=1e-3)
    assert weights["w8a8"] / weights["w4a8"] == pytest.approx(2, rel=1e-3)


def test_the_ceiling_is_one_point_per_configuration_at_natural_routing():
    from xstage_bench.megamoe.points import expand_points

    base = {"id": "flash/w8a8/balanced/T=1024/P=2", **FLASH, "tokens_per_rank": 1024}
    rehomed = {**base, "id": base["id"] + "/remote=0.875", "remote_fraction": 0.875}
    moe = {"schedules": ["expert_wave", "interleaved"], "variants": ["ours", "gemm_ceiling"]}
    ids = [p["id"] for p in expand_points([base, rehomed], moe)]
    assert ids.count("flash/w8a8/balanced/T=1024/P=2/gemm_ceiling") == 1
    assert not any("remote=0.875/gemm_ceiling" in i for i in ids)


def test_the_ceiling_on_a_machine_without_a_gpu_is_recorded_unsupported():
    from types import SimpleNamespace

    from xstage_bench.megamoe.baselines.measure import GemmCeiling

    point = {"id": "flash/w8a8/balanced/T=1024/P=2/gemm_ceiling", **FLASH, "tokens_per_rank": 1024}
    record = GemmCeiling(SimpleNamespace(cuda=False, sampler=None)).measure(point)
    assert record["status"] == "unsupported"
    assert "cuBLAS on a GPU" in record["error"]


def test_the_baselines_are_compared_where_they_run():
    """One GPU: the baselines run at the host path's f = 0 control, so ours is compared
    with them there (natural routing on the peer path), never at a host share."""
    import pandas as pd

    from xstage_bench.report.analysis import megamoe

    frame = pd.DataFrame(
        {
            "path": ["host", "host", "peer", "peer"],
            "remote_fraction": ["0", "0.25", "natural", "0.875"],
        }
    )
    kept = megamoe.at_baseline_setting(frame)
    assert kept.to_dict("records") == [
        {"path": "host", "remote_fraction": "0"},
        {"path": "peer", "remote_fraction": "natural"},
    ]

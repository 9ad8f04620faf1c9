"""One worker process of the per-GPU process model (distributed.py): its share of a
configuration, built collectively, and its check and timing of each point in lockstep
with the other ranks.

Each rank builds only its share of a configuration: its home tokens and its experts'
weights (seeded by rank as inputs.py seeds them, so the inputs are the single-process
path's), the routing of every home rank (numpy, cheap), and its dispatched rows, received
through an all_to_all (NCCL; not timed). Its combine buffer is its chunk of a peer window
(fabric.window: CUDA VMM chunks that every rank maps into one range), so a row's
destination is the offset from this rank's chunk to its home rank's chunk plus the row's
slot, as with peer access in one process.

One timed repetition, on every rank: flush L2, a cross-rank device barrier (start
together), zero the sync buffer and launch the kernel, a device barrier (system-scope
fence: every rank's stores have landed), the top-k reduction. time_us is the slowest
rank's events from after the first barrier to after its reduction; kernel_us the slowest
rank's kernel alone. The check before timing is the single-process path's, judged by the
same verdict (verdict.py): poisoned outputs, error flags, NaN, sampled tokens of every
home rank against the torch reference (each rank adds its experts' share of it), and each
later schedule bitwise equal to expert-wave. Each point goes through protocol.measure_point
in lockstep (lockstep.Lockstep.measure_point).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xstage_bench.measurement import faults, timing
from xstage_bench.measurement.protocol import Measured, PointFailed, wrong
from xstage_bench.measurement.workers.lockstep import Lockstep
from xstage_bench.megamoe import reference, routing, schedule
from xstage_bench.megamoe.layer.accounting import nvlink_bytes, useful_flops
from xstage_bench.megamoe.layer.inputs import make_expert_weights, make_home_tokens
from xstage_bench.megamoe.layer.rank import (
    RankBuffers,
    check_tiles,
    launch_rank,
    poison_rank,
    rank_buffers,
    realized_order_error,
    tiles_for,
)
from xstage_bench.megamoe.layer.reduction import combine_rank
from xstage_bench.megamoe.ours import verdict
from xstage_bench.megamoe.points import CPU_PROGRAMS, config_id, lead_failure, sampled_tokens
from xstage_bench.megamoe.reference import HomeTokens
from xstage_kernels import megamoe as kernel


def dispatch_rows(src, plans: list[routing.RankRows], rank: int, group):
    """This rank's received rows of one home-token field (T, width), in its padded
    expert-major layout: every home rank sends each expert rank the rows that rank's plan
    lists from it, in plan order (one all_to_all of raw bytes); padding rows stay zero."""
    import torch
    import torch.distributed as dist

    world = len(plans)
    send_tokens = [plans[d].token[plans[d].home == rank] for d in range(world)]
    recv_at = [np.flatnonzero(plans[rank].home == r) for r in range(world)]
    src_bytes = src.view(torch.uint8)
    send = src_bytes[torch.as_tensor(np.concatenate(send_tokens), device=src.device)]
    recv = torch.empty(
        sum(len(a) for a in recv_at), src_bytes.shape[1], dtype=torch.uint8, device=src.device
    )
    dist.all_to_all_single(
        recv,
        send.contiguous(),
        output_split_sizes=[len(a) for a in recv_at],
        input_split_sizes=[len(t) for t in send_tokens],
        group=group,
    )
    out = torch.zeros(plans[rank].padded_rows, src.shape[1], dtype=src.dtype, device=src.device)
    out.view(torch.uint8)[torch.as_tensor(np.concatenate(recv_at), device=src.device)] = recv
    return out


@dataclass
class Share:
    """One rank's share of a configuration."""

    point: dict  # with skew_zipf
    plans: list[routing.RankRows]  # every rank's (rank 0 reports them all)
    home: HomeTokens
    rb: RankBuffers
    window: object  # the peer window holding every rank's combine buffer

    def close(self) -> None:
        self.window.close()


def build_share(point: dict, megamoe: dict, fabric, *, num_programs: int, seed: int) -> Share:
    """Collective: every rank calls it with the same point."""
    import torch

    from xstage_bench.measurement.vmm import tensor_at

    check_tiles(megamoe)
    q, world = fabric.rank, fabric.world_size
    full = {**point, "skew_zipf": megamoe["skew_zipf"]}
    T, topk, H = point["tokens_per_rank"], point["topk"], point["H"]
    ids = [routing.route(full, megamoe["skew_zipf"], r, seed)[0] for r in range(world)]
    plans = routing.dispatch_plan(ids, point["E"], kernel.BLOCK_M)
    home = make_home_tokens(full, point["precision"], q, fabric.device, seed)
    nbytes = T * topk * H * 2
    window = fabric.window(nbytes)
    try:
        comb = tensor_at(
            window.chunk_ptr(q), nbytes, fabric.device, torch.bfloat16, (T * topk, H), (H, 1)
        )
        offsets = np.array([(window.chunk_ptr(r) - window.chunk_ptr(q)) // 2 for r in range(world)])
        x = dispatch_rows(home.xq, plans, q, fabric.group)
        if point["precision"] == "bf16":
            xs = torch.zeros(1, dtype=torch.float32, device=fabric.device)
        else:
            xs = dispatch_rows(home.xs, plans, q, fabric.group)
        rb = rank_buffers(
            full,
            megamoe,
            plans[q],
            device=fabric.device,
            x=x,
            xs=xs,
            comb=comb,
            comb_offsets=offsets,
            combine_weights=home.weights,
            num_programs=num_programs,
        )
    except BaseException:
        window.close()
        raise
    return Share(full, plans, home, rb, window)


class MoERank(Lockstep):
    """One worker's state: its fabric, its experts' weights, the current configuration."""

    def __init__(
        self,
        fabric,
        policy: timing.TimingPolicy,
        megamoe: dict,
        *,
        check_tokens: int,
        tolerance: float = reference.TOLERANCE,
        dump_dir: str | None = None,
    ):
        import torch

        super().__init__(fabric)
        self.tolerance = tolerance
        self.dump_dir = Path(dump_dir) if dump_dir else None
        self.torch, self.policy, self.moe = torch, policy, megamoe
        self.check_tokens, self.seed = check_tokens, 0
        cuda = fabric.device_type == "cuda"
        self.num_programs = (
            torch.cuda.get_device_properties(fabric.device).multi_processor_count
            if cuda
            else CPU_PROGRAMS
        )
        self.flush = timing.l2_flusher(torch, fabric.rank) if cuda and policy.flush_l2 else None
        self._weights_key, self.experts = None, None
        self._share_id, self.share = None, None
        self._reference = None
        self._outputs: dict[str, object] = {}

    # ---- the configuration ----------------------------------------------------------

    def load(self, point: dict) -> Share:
        cid = config_id(point)
        if cid == self._share_id:
            return self.share
        self.release()
        key = (point["shape"], point["precision"])
        if key != self._weights_key:
            self.experts = None  # free the old weights before making the new ones
            self.experts = make_expert_weights(
                point, point["precision"], self.fabric.rank, self.fabric.device, self.seed
            )
            self._weights_key = key
        self.share = build_share(
            point, self.moe, self.fabric, num_programs=self.num_programs, seed=self.seed
        )
        self._share_id = cid
        return self.share

    def release(self) -> None:
        """Free the current configuration's window once no rank still writes into it."""
        if self.share is None:
            return
        self.fabric.wait()
        self.fabric.host_barrier()
        self.share.close()
        self.share, self._share_id, self._reference, self._outputs = None, None, None, {}

    def reference(self, tokens: list[np.ndarray]):
        """fp32 reference rows of this rank's sampled tokens. Collective: every rank adds
        its own experts' share for every home rank's sampled tokens."""
        import torch.distributed as dist

        if self._reference is not None:
            return self._reference
        torch, share = self.torch, self.share
        q, device = self.fabric.rank, self.fabric.device
        picked = torch.as_tensor(tokens[q], device=device)
        mine = {
            "xq": share.home.xq.view(torch.uint8)[picked].cpu().numpy(),
            "xs": None if share.home.xs is None else share.home.xs[picked].cpu().numpy(),
            "ids": share.home.ids[tokens[q]],
            "weights": share.home.weights[tokens[q]],
        }
        homes = [
            HomeTokens(
                torch.from_numpy(h["xq"]).to(device).view(share.home.xq.dtype),
                None if h["xs"] is None else torch.from_numpy(h["xs"]).to(device),
                h["ids"],
                h["weights"],
            )
            for h in self.gather(mine)
        ]
        every = [np.arange(len(t)) for t in tokens]
        precision = share.point["precision"]
        fmt = reference.ours_for(precision, homes[0].xq)
        partial = reference.reference_outputs(
            homes, {q: self.experts}, every, precision, intermediate_format=fmt
        )
        total = torch.stack([p.cpu() for p in partial])
        dist.all_reduce(total, group=self.fabric.ctrl)
        self._reference = total[q].to(device)
        return self._reference

    # ---- one point, on every rank -----------------------------------------------------

    def check(self, point: dict) -> dict:
        """One poisoned run of the point's schedule; this rank's facts. Collective."""
        torch, fabric = self.torch, self.fabric
        share = self.load(point)
        rb = share.rb
        poison_rank(torch, rb)
        fabric.wait()
        fabric.host_barrier()  # nobody writes into a peer before that peer has poisoned
        checked = rb
        key = tiles_for(rb, point, self.moe, self.num_programs)
        if faults.injected("wrong", point["id"]) and fabric.rank == 0:
            # A deliberately wrong variant: the last tile of the list is never computed.
            tiles = rb.tiles[key]
            checked = dataclasses.replace(rb, tiles={key: tiles[:-1]})
        launch_rank(checked, self.experts, share.point, key, self.num_programs)
        fabric.barrier()
        combine_rank(rb, share.point)
        fabric.wait()
        tokens = sampled_tokens(
            point["tokens_per_rank"], self.check_tokens, fabric.world_size, self.seed
        )
        facts = {
            "flag": int(rb.sync[1].item()),
            "nan": bool(torch.isnan(rb.out).any()),
            "rel_error": reference.relative_error(
                rb.out[torch.as_tensor(tokens[fabric.rank], device=rb.out.device)],
                self.reference(tokens),
            ),
            "checked_tokens": len(tokens[fabric.rank]),
            "order_error": realized_order_error(rb, key, point, self.moe, self.num_programs),
        }
        self._outputs[point["schedule"]] = rb.out.clone()
        if self.dump_dir is not None:
            name = point["id"].replace("/", "__")
            torch.save(rb.out.cpu(), self.dump_dir / f"{name}.rank{fabric.rank}.pt")
        first = self._outputs.get(schedule.WAVE)
        if point["schedule"] != schedule.WAVE and first is not None:
            facts["bitwise_equal"] = bool(torch.equal(first, rb.out))
        return facts

    def timed_rep(self, schedule: str) -> tuple[float, float]:
        """One repetition on this rank of tile list `schedule` (a key of rb.tiles): (layer
        us, kernel us)."""
        fabric, share = self.fabric, self.share
        if self.flush is not None:
            self.flush()
        fabric.barrier()  # start together
        start = fabric.stamp()
        launch_rank(share.rb, self.experts, share.point, schedule, self.num_programs)
        launched = fabric.stamp()
        fabric.barrier()  # every rank's combine stores have landed
        combine_rank(share.rb, share.point)
        done = fabric.stamp()
        fabric.wait(done)
        return fabric.elapsed_us(start, done), fabric.elapsed_us(start, launched)

    def execute(self, point: dict) -> dict | None:
        """Check, then time one point on every rank in lockstep; rank 0's record counts."""
        return self.measure_point(
            point, lambda: self._checked(point), lambda facts: self._timed(point, facts)
        )

    def _checked(self, point: dict) -> dict:
        """Every rank's check, judged by the one verdict: the record's check facts."""
        failure = lead_failure(point)
        if failure is not None:  # every rank has the same point: none runs the check
            raise failure
        facts, error = self.agree(lambda: self.check(point))
        if error:
            status = "timeout" if "WaitTimeout" in error else "failed"
            raise PointFailed(f"check: {error}", status=status)
        error, extra = verdict.of_ranks(self.gather(facts), self.tolerance)
        if error:
            raise wrong(error, extra)
        return extra

    def _timed(self, point: dict, extra: dict) -> Measured | None:
        key = tiles_for(self.share.rb, point, self.moe, self.num_programs)
        timed = self.timed(lambda: self.timed_rep(key), 2, self.policy, facts=extra)
        if timed is None:  # ranks > 0
            return None
        times, (kernel_us,) = timed.samples, timed.others
        plans = self.share.plans
        flops = useful_flops(point, plans) / len(plans)
        nvlink = nvlink_bytes(point, plans)
        extra = {
            **extra,
            "tflops": flops / (statistics.median(times) * 1e6),
            "tflops_kernel": flops / (statistics.median(kernel_us) * 1e6),
            "remote_bytes": int(sum(nvlink)),
            "nvlink_bytes": int(sum(nvlink)),
            "nvlink_bytes_per_rank": nvlink,
            "padded_rows_per_rank": [p.padded_rows for p in plans],
            "stop_reason": times.stop_reason,
        }
        return Measured({"time_us": list(times), "kernel_us": kernel_us}, extra, correct=True)

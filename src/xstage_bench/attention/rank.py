"""One attention worker's state and its part of each point group, in lockstep with the
other ranks: the backends it loaded, the buffers of the current path and shape, every
arm's check on fresh inputs, then the arms that passed timed together in paired rounds,
and (rank 0) the records built from them. The host path's groups run on rank 0 alone
while the others wait.
"""

from __future__ import annotations

import contextlib
import statistics
import uuid

from xstage_bench.attention.points import arm_name, compared_ratios
from xstage_bench.data import storepath
from xstage_bench.measurement import timing
from xstage_bench.measurement.protocol import Measured, PointFailed, wrong
from xstage_bench.measurement.workers.lockstep import Lockstep


def point_seed(point_id: str, rank: int) -> int:
    """A stable seed per (point, rank): fresh inputs per point, reproducible per run."""
    import zlib

    return zlib.crc32(f"{point_id}/{rank}".encode())


class Rank(Lockstep):
    """One worker's state: its fabric, cached backends and the current shapes' buffers
    (the peer path's, on every rank; the host path's, on rank 0 alone)."""

    def __init__(self, fabric, policy: timing.TimingPolicy, dtype, triton_config):
        super().__init__(fabric)
        self.policy, self.dtype = policy, dtype
        self.triton_config = triton_config
        self.backends: dict[str, object] = {}
        self.workspace = None  # the peer path's (every rank in lockstep)
        self.host_workspace = None  # the host path's (rank 0, working alone)
        self._solo_fabric = None
        self._timings = 0  # numbers each paired timing of this process
        self._session = uuid.uuid4().hex[:8]
        self.flush = None
        if fabric.device_type == "cuda" and policy.flush_l2:
            import torch

            self.flush = timing.l2_flusher(torch, fabric.rank)

    # -- one point, on every rank --
    def backend(self, name: str):
        from xstage_bench.attention.backends import BackendUnavailable, load_backend

        if name not in self.backends:
            try:
                self.backends[name] = load_backend(name, self.triton_config)
            except BackendUnavailable as e:
                self.backends[name] = e
        found = self.backends[name]
        if isinstance(found, Exception):
            raise found
        return found

    def shape(self, point: dict):
        """The workspace of the point's path and shape, built when it changes."""
        from xstage_bench.attention.emulation import EmulatedWorkspace
        from xstage_bench.attention.host import HostWorkspace
        from xstage_bench.attention.layout import UlyssesLayout
        from xstage_bench.attention.modes import Workspace

        emulated = point.get("emulated_world_size")
        layout = UlyssesLayout(
            point["batch"],
            point["seq_len"],
            point["heads"],
            point["head_dim"],
            emulated or self.fabric.world_size,
        )
        if storepath.point_path(point) == storepath.HOST:
            ws = self.host_workspace
            if ws is None or ws.layout != layout:
                fabric = self.solo_fabric()
                if ws is not None:
                    fabric.wait()  # no kernel still writes into the old range
                    self.host_workspace = None
                    ws.close()
                self.host_workspace = HostWorkspace(layout, fabric, self.dtype)
            return self.host_workspace
        kind = EmulatedWorkspace if emulated else Workspace
        if not isinstance(self.workspace, kind) or self.workspace.layout != layout:
            if self.workspace is not None:
                self.fabric.wait()
                self.fabric.host_barrier()  # no peer still writes into the old window
                self.workspace.close()
                self.workspace = None
            self.workspace = kind(layout, self.fabric, self.dtype)
        return self.workspace

    def solo_fabric(self):
        from xstage_bench.measurement.fabric import SoloFabric

        if self._solo_fabric is None:
            self._solo_fabric = SoloFabric(self.fabric)
        return self._solo_fabric

    def execute(self, message: dict) -> dict | None:
        """Rank 0's record of one point (`message` a point), or every record of a group by
        id (`message` = {"group": [points]}), checked, then timed in paired rounds. Every
        rank calls it in lockstep, except on the host path, where rank 0 works alone and
        the others wait; ranks > 0 return None."""
        if "group" not in message:
            records = self.execute_group([message])
            return None if records is None else records[message["id"]]
        return self.execute_group(message["group"])

    def execute_group(self, points: list[dict]) -> dict[str, dict] | None:
        found: dict[str, tuple] = {}
        host = storepath.point_path(points[0]) == storepath.HOST
        if host and self.fabric.rank != 0:
            self.wait_solo()
            return None
        with self.solo() if host else contextlib.nullcontext():
            return self.measure_group(
                points,
                lambda point: self._checked(point, found),
                lambda passed: self._time_group(passed, found),
            )

    def _checked(self, point: dict, found: dict) -> dict:
        """Every rank's check of the point; the record's check facts. Fills found[id]
        with the backend and the workspace it ran on."""
        from xstage_bench.attention.emulation import unsupported_on
        from xstage_bench.attention.modes import check

        pid, mode = point["id"], point["mode"]
        if "emulated_world_size" in point and storepath.point_path(point) == storepath.PEER:
            unsupported = unsupported_on(self.fabric.world_size)
            if unsupported:
                raise PointFailed(unsupported, status="unsupported")
        backend, error = self._backend_or_reason(point)
        if error:
            raise PointFailed(error, status="unsupported")
        ws, error = self.agree(lambda: self.shape(point))
        if error:
            raise PointFailed(f"buffers: {error}")
        if mode == "fused" and backend.name != "triton" and ws.target.peer_out is None:
            needs = (
                "an out view over one device/host range"
                if storepath.point_path(point) == storepath.HOST
                else "a peer-backed out view"
            )
            reason = f"{backend.name} fused needs {needs}: "
            raise PointFailed(reason + ws.target.peer_out_reason, status="unsupported")
        seed = point_seed(pid, self.fabric.rank)
        verdict, error = self.agree(lambda: check(backend, mode, ws, seed))
        if error:
            status = "timeout" if "WaitTimeout" in error else "failed"
            raise PointFailed(f"check: {error}", status=status)
        verdicts = self.gather(verdict)
        extra = {
            "max_abs_err": max(v.max_abs_err for v in verdicts),
            "bitwise_equal_serial": (
                None if mode != "fused" else all(v.bitwise_equal_serial for v in verdicts)
            ),
        }
        if storepath.point_path(point) == storepath.HOST:
            extra["host_memory"] = ws.host_memory
            extra["host_bytes"] = ws.node.host_bytes(ws.dtype.itemsize) if mode != "alone" else 0
        wrong_ranks = [f"rank {r}: {v.detail}" for r, v in enumerate(verdicts) if not v.correct]
        if wrong_ranks:
            raise wrong("wrong result: " + "; ".join(wrong_ranks), extra)
        found[pid] = (backend, ws)
        return extra

    def _backend_or_reason(self, point: dict):
        from xstage_bench.attention.backends import BackendUnavailable

        try:
            backend, error = self.backend(point["backend"]), None
        except BackendUnavailable as e:
            backend, error = None, str(e)
        errors = [e for e in self.gather(error) if e]
        return backend, (errors[0] if errors else None)

    def _time_group(self, passed: list[tuple[dict, dict]], found: dict) -> dict | None:
        """Time the checked points of a group together in paired rounds; rank 0 gets
        {id: Measured or PointFailed}, the others None."""
        from xstage_bench.attention.modes import timed_rep

        arms = {arm_name(point): (point, facts) for point, facts in passed}
        leads = {arm: self._lead() for arm in arms}
        reps = {}
        for arm, (point, _) in arms.items():
            backend, ws = found[point["id"]]
            reps[arm] = lambda b=backend, m=point["mode"], w=ws, lead=leads[arm]: timed_rep(
                b, m, w, self.flush, lead
            )
        timed = self.timed_paired(reps, 2, self.policy, compared_ratios(arms))
        if timed is None:  # ranks > 0
            return None
        self._timings += 1
        ran = [arm for arm in arms if not isinstance(timed[arm], str)]
        token = f"{self._session}-{self._timings}"
        outcomes = {}
        for arm, (point, facts) in arms.items():
            got = timed[arm]
            if isinstance(got, str):
                status = "timeout" if "WaitTimeout" in got else "failed"
                outcomes[point["id"]] = PointFailed(
                    f"timing: {got}", status=status, correct=True, extra=facts
                )
                continue
            paired = {**timing.paired_extra(ran, arm, got.samples), "group": token}
            lead = timing.lead_facts(leads[arm])  # rank 0's
            outcomes[point["id"]] = self._measured(point, {**facts, **lead}, got, found, paired)
        return outcomes

    def _lead(self):
        """A HostLead for one arm where the policy asks for one (GPU clocks only)."""
        if self.fabric.device_type != "cuda":
            return None
        return timing.host_lead(self.policy)

    def _measured(self, point, facts, timed, found, paired) -> Measured:
        samples, (completion,) = timed.samples, timed.others
        _, ws = found[point["id"]]
        extra = {
            **facts,
            "tflops": ws.layout.attention_flops() / (statistics.median(samples) * 1e6),
            "stop_reason": samples.stop_reason,
            "warmup": samples.warmup,
            "paired": paired,
        }
        if point["backend"] == "triton":
            from xstage_kernels.flash_ulysses import launch_config

            extra["triton_config"] = launch_config(ws.q, ws.k, ws.v, self.triton_config)
        return Measured(
            {"sender_us": list(samples), "completion_us": completion}, extra, correct=True
        )

    def close(self) -> None:
        """Free this rank's buffers (call when no rank still writes into them)."""
        for ws in (self.workspace, self.host_workspace):
            if ws is not None:
                ws.close()
        self.workspace = self.host_workspace = None

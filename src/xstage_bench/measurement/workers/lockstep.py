"""The control channel of the ranks of one world, over its gloo group: rank 0 broadcasts
each step, every rank takes part. An experiment's per-rank state subclasses `Lockstep`
and measures each point through it: the check and the timing run on every rank (their
collectives), rank 0 keeps the record. A group of points is timed in paired rounds
(`Lockstep.measure_group`, `Lockstep.timed_paired`: timing.measure_paired's protocol).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from xstage_bench.measurement import protocol
from xstage_bench.measurement.protocol import PointFailed

# Control messages besides points: one timed repetition of an arm, the end of a timing,
# and, while rank 0 works alone (Lockstep.solo), a keep-alive and the end of it.
REP, END, IDLE, SOLO_END = "rep", "end", "idle", "solo-end"


@dataclass
class Timed:
    """Rank 0's result of Lockstep.timed: the stopping rule's samples of the first time
    and the other times of the same repetitions (one list each)."""

    samples: object  # timing.Samples
    others: list[list[float]]


class ArmFailed(RuntimeError):
    """One arm of a paired timing failed (on some rank); the others can go on without it."""

    def __init__(self, arm: str, error: str):
        super().__init__(f"{arm}: {error}")
        self.arm, self.error = arm, error


class _GroupClocks:
    """The clock samples taken around a whole group, replayed for each of its records
    (protocol.measure_point samples once before its check and once after its timing)."""

    def __init__(self, before, after):
        self._samples = [before, after]

    def sample(self):
        return self._samples.pop(0) if len(self._samples) > 1 else self._samples[0]


def _clock_sampler(fabric):
    if fabric.device_type != "cuda":
        return None
    from xstage_bench.measurement.clocks import ClockSampler

    return ClockSampler(list(range(fabric.world_size)))


class Lockstep:
    """The control channel over the gloo group: rank 0 broadcasts, every rank answers."""

    def __init__(self, fabric):
        self.fabric = fabric
        self.broken = False  # a bounded wait timed out: this fabric cannot be trusted
        self.sampler = _clock_sampler(fabric) if fabric.rank == 0 else None
        self._solo = False

    @contextlib.contextmanager
    def solo(self):
        """Rank 0 works alone inside this block: no other rank takes part in its checks
        and timings (the host path: this GPU and host memory). Its collectives become
        local (`gather` returns its own value, `rep_max` its own times) and each sends
        the other ranks, waiting in `wait_solo`, one IDLE, so that none of their waits
        outlasts the collective timeout however long rank 0 works."""
        if self.fabric.rank != 0:
            raise RuntimeError("only rank 0 works alone; the others wait_solo()")
        self._solo = True
        try:
            yield
        finally:
            self._solo = False
            self.command(SOLO_END)

    def wait_solo(self) -> None:
        """Ranks > 0: wait while rank 0 works alone."""
        while self.command() == IDLE:
            pass

    def measure_point(self, point: dict, check, measure) -> dict | None:
        """protocol.measure_point in lockstep: every rank runs `check` and `measure` (their
        collectives), rank 0 samples the clocks and returns the point's record; the other
        ranks record nothing (None)."""
        if self.fabric.rank == 0:
            return protocol.measure_point(point, check, measure, sampler=self.sampler)
        try:
            measure(check())
        except PointFailed:
            pass  # rank 0 records it
        return None

    def command(self, message=None):
        import torch.distributed as dist

        box = [IDLE if self._solo else message]
        dist.broadcast_object_list(box, src=0, group=self.fabric.ctrl)
        return message if self._solo else box[0]

    def gather(self, value) -> list:
        import torch.distributed as dist

        if self._solo:
            self.command()
            return [value]
        out = [None] * self.fabric.world_size
        dist.all_gather_object(out, value, group=self.fabric.ctrl)
        return out

    def agree(self, fn):
        """Run `fn` on every rank; (value on this rank, first error on any rank or None)."""
        from xstage_bench.measurement.fabric import WaitTimeout

        value, error = None, None
        try:
            value = fn()
        except WaitTimeout as e:
            self.broken = True
            error = f"{type(e).__name__}: {e}"
        except Exception as e:
            error = f"rank {self.fabric.rank}: {type(e).__name__}: {e}"
        errors = [e for e in self.gather(error) if e]
        return value, (errors[0] if errors else None)

    def rep_max(self, rep: Callable[[], tuple[float, ...]], width: int) -> tuple[float, ...]:
        """Run one repetition `rep` (-> `width` times) on every rank; each time's maximum
        over ranks. RuntimeError, naming the rank, when it failed on any rank."""
        import torch
        import torch.distributed as dist

        from xstage_bench.measurement.fabric import WaitTimeout

        error = None
        try:
            values = tuple(rep())
        except Exception as e:
            self.broken = self.broken or isinstance(e, WaitTimeout)
            values = (0.0,) * width
            error = f"rank {self.fabric.rank}: {type(e).__name__}: {e}"
        if self._solo:
            self.command()
            if error:
                raise RuntimeError(error)
            return tuple(float(x) for x in values)
        t = torch.tensor([*values, float(error is not None)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.fabric.ctrl)
        if t[-1] > 0:
            raise RuntimeError(error or "a peer rank failed this repetition")
        return tuple(float(x) for x in t[:-1])

    def timed(
        self, rep: Callable[[], tuple[float, ...]], width: int, policy, *, facts: dict | None
    ) -> Timed | None:
        """Time `rep` on every rank in lockstep: rank 0's stopping rule (timing.measure)
        over the first of its times, rank 0 broadcasting one "rep" per repetition. Rank 0
        gets the result (the other ranks None); PointFailed (correct, with the check's
        `facts`) when the timing failed."""
        from xstage_bench.measurement import timing

        if self.fabric.rank != 0:
            while self.command() == "rep":
                try:
                    self.rep_max(rep, width)
                except RuntimeError:
                    pass  # rank 0 records the failure
            return None
        others: list[tuple[float, ...]] = []

        def run_once() -> float:
            self.command("rep")
            first, *rest = self.rep_max(rep, width)
            others.append(tuple(rest))
            return first

        try:
            samples = timing.measure(run_once, policy)
        except Exception as e:
            status = "timeout" if "WaitTimeout" in str(e) else "failed"
            raise PointFailed(f"timing: {e}", status=status, correct=True, extra=facts) from e
        finally:
            self.command("end")
        rest = [list(col) for col in zip(*others[-len(samples) :], strict=True)]
        return Timed(samples, rest)

    def timed_paired(
        self,
        reps: dict[str, Callable[[], tuple[float, ...]]],
        width: int,
        policy,
        ratios: list[tuple[str, str]] = (),
    ) -> dict[str, Timed | str] | None:
        """Time the arms `reps` (name -> one repetition -> `width` times) together, in
        rounds (timing.measure_paired over the first of their times, with the compared
        `ratios` measured again while noisy): rank 0 broadcasts each repetition's arm,
        every rank runs it, each time is the maximum over ranks.

        Rank 0 gets {arm: Timed} for the arms timed to the end and {arm: error} for any
        that failed; an arm that fails is dropped and the others are timed again from
        round 0 without it (their rounds must stay one set), unless the fabric broke,
        which ends them all. The other ranks get None.
        """
        from xstage_bench.measurement import timing

        if self.fabric.rank != 0:
            while (message := self.command()) != END:
                try:
                    self.rep_max(reps[message[1]], width)
                except RuntimeError:
                    pass  # rank 0 records the failure
            return None
        results: dict[str, Timed | str] = {}
        arms = list(reps)
        try:
            while arms:
                rows: dict[str, list[tuple[float, ...]]] = {arm: [] for arm in arms}

                def run_once_of(arm: str, rows=rows) -> Callable[[], float]:
                    def run_once() -> float:
                        self.command((REP, arm))
                        try:
                            first, *rest = self.rep_max(reps[arm], width)
                        except RuntimeError as e:
                            raise ArmFailed(arm, str(e)) from e
                        rows[arm].append(tuple(rest))
                        return first

                    return run_once

                try:
                    compared = [r for r in ratios if set(r) <= set(arms)]
                    samples = timing.measure_paired(
                        {a: run_once_of(a) for a in arms}, policy, ratios=compared
                    )
                except ArmFailed as failed:
                    results[failed.arm] = failed.error
                    arms.remove(failed.arm)
                    if self.broken:
                        results.update({a: f"not timed: {failed}" for a in arms})
                        arms = []
                    continue
                except Exception as e:  # a time that is not a time (TimingError), ...
                    results.update({a: f"{type(e).__name__}: {e}" for a in arms})
                    break
                for arm, got in samples.items():
                    kept = rows[arm][-len(got) :]  # the warm-up rounds came first
                    results[arm] = Timed(got, [list(c) for c in zip(*kept, strict=True)])
                break
        finally:
            self.command(END)
        return results

    def measure_group(
        self,
        points: list[dict],
        check: Callable[[dict], dict | None],
        time_passed: Callable[[list[tuple[dict, dict | None]]], dict | None],
    ) -> dict[str, dict] | None:
        """Check every point of a group, then time those that passed together: on every
        rank (their collectives); rank 0 returns each point's record by id, the others
        None. `check(point)` gives the record's facts or raises PointFailed (then the
        point is recorded so and never timed); `time_passed([(point, facts), ...])` gives
        rank 0 {id: protocol.Measured or PointFailed}. Every check runs before any timing.
        The clocks are sampled around the whole group: its records carry the same two
        samples (protocol.measure_point builds each record)."""
        before = self.sampler.sample() if self.sampler is not None else None
        outcomes: dict[str, object] = {}
        passed = []
        for point in points:
            try:
                passed.append((point, check(point)))
            except PointFailed as failed:
                outcomes[point["id"]] = failed
        timed = time_passed(passed) if passed else {}
        if self.fabric.rank != 0:
            return None
        outcomes.update(timed)
        after = self.sampler.sample() if self.sampler is not None else None
        records = {}
        for point in points:
            outcome = outcomes[point["id"]]

            def replay(outcome=outcome):
                if isinstance(outcome, PointFailed):
                    raise outcome
                return outcome

            clocks = _GroupClocks(before, after) if self.sampler is not None else None
            records[point["id"]] = protocol.measure_point(
                point, lambda: None, lambda _, replay=replay: replay(), sampler=clocks
            )
        return records

    def follow(self, execute: Callable[[object], object]) -> None:
        """Ranks > 0: execute what rank 0 broadcasts until it sends None."""
        while (message := self.command()) is not None:
            execute(message)

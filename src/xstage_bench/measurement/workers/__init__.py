"""One process per GPU: spawn the ranks, join their groups, keep them in lockstep, and
survive a rank that hangs or dies.

An experiment provides a module-level `worker(rank, job)` (spawned, so it must be
importable) that calls `groups.join`, runs its points (rank 0 drives `sweep.run_sweep`
through `drive.drive` and broadcasts each point through a `lockstep.Lockstep`; the others
follow), and ends with `groups.leave`. `launcher.launch` starts the ranks (one is a world
too: a single GPU, groups of one) and, when an attempt ends early, records the point it
died in and resumes the sweep in fresh processes.

By role, and by the process each runs in:

    launcher.py  the parent: the ranks' environment, spawning them, an attempt's end,
                 the crashed point recorded, the restarts
    groups.py    every rank: joining the process groups, leaving them together, exiting
    drive.py     rank 0: the sweep, each point broadcast to the others, the point in
                 flight noted for the launcher
    lockstep.py  every rank: the control channel (broadcasts, gathers, timings in
                 lockstep, the paired rounds of a group)
"""

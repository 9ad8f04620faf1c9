"""How a point is measured on a GPU: the protocol, timers and clocks, sweeps and workers,
the store paths' far-end buffers (peer windows, host memory), GPU locks, injected faults,
the environment block, the machine probe."""

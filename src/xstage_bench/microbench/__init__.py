"""Remote-store microbenchmarks: the CUDA kernels (kernels/microbench/burst.cu), how they
are built (build), what a point asks of them (planning: the train and its destinations;
gap_calibration: gap iterations to ns), how they are launched (launch: arguments and error
bits; bench: the GPU half, CuPy) and read back (store_pattern: the expected stores;
stamp_metrics: stamps to samples), and run over a study's grid (runner; errors: what each
failure is recorded as)."""

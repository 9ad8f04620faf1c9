"""Remote-store microbenchmarks: the CUDA kernels (kernels/microbench/burst.cu), how they
are built (build), launched and read back (launch), and run over a study's grid (runner)."""

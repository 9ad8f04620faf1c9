"""The analysis layer: a dataset's raw and model files as validated documents and data
frames, labels and derived quantities. Figures and tables both read it; it draws nothing
(no matplotlib or seaborn import), so a table never loads the plotting stack.

load      raw and model documents (schema-validated), NoDataError
frames    records as a data frame, usable rows, failure notes
labels    dataset labels (measured GPU or simulated), byte sizes, series names
fitted    the fitted model's parameters (T0, R, Q, per-K, window variant, ceilings)
megamoe   MegaMoE sweeps: configurations, paths and shares, schedule speedups with CIs
megamoe_baselines  ours beside the baselines, the unfused GEMM paths, the cuBLAS ceiling
megamoe_emulated   the compute-emulated sweep, and the crossover rate from the fitted R
megamoe_lead       the lead map: speedup per lead, the best lead, the model's own
speedup_ci         paired-sample ratio CIs and verdicts
attention Ulysses sweeps: serial over fused
"""

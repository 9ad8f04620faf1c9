"""The analysis layer: a dataset's raw and model files as validated documents and data
frames, labels and derived quantities. Figures and tables both read it; it draws nothing
(no matplotlib or seaborn import), so a table never loads the plotting stack.

load      raw and model documents (schema-validated), NoDataError
frames    records as a data frame, usable rows, failure notes
labels    dataset labels (measured GPU or simulated), byte sizes, series names
fitted    the fitted model's parameters (T0, R, Q, per-K, window variant, ceilings)
megamoe   MegaMoE sweeps: configurations, speedups, baselines, the emulated sweep
attention Ulysses sweeps: serial over fused
"""

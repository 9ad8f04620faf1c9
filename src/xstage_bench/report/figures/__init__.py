"""Figures: one module per figure, each a pure function of a dataset's raw and model files.

Every module has `plot(dataset_dir) -> Figure`; `xstage_bench.report.render` saves it.
"""

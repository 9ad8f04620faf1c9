"""Tables: one module per table, each a pure function of a dataset's raw and model files.

Every module has `build(dataset_dir) -> Table`; `xstage_bench.report.render` writes it as CSV and
Markdown.
"""

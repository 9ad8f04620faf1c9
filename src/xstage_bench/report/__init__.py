"""What a reader sees: the frames (analysis), figures, tables, the products and their renderer,
the report's summary page, the paper's numbers, the generated blocks of the README and docs/."""

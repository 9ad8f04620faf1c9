# Stage 5: every figure and table is one rule, one renderer module, one output, made from
# the raw JSON (and the fitted model) of one dataset. Figures are a PDF with a PNG beside it,
# tables a CSV with a Markdown copy. The report shows a figure's PNG (a browser previews it
# inline, where a PDF pane stays blank) and a table's CSV, each with its caption.
# Outputs are update(): Snakemake keeps the previous file until the job succeeds and puts it
# back when the job fails, so a failed rerun never deletes a committed reference figure.


def in_report(path, product):
    return report(
        path,
        caption=f"../report/{product.name}.rst",
        category="{dataset}",
        subcategory=product.folder,
        labels={"product": product.name, "dataset": "{dataset}"},
    )


for _product in products.PRODUCTS.values():
    _main = product_output("{dataset}", _product)
    _second = product_output("{dataset}", _product, companion=True)

    rule:
        name:
            _product.rule
        input:
            product_inputs(_product),
        output:
            main=update(_main if _product.is_figure else in_report(_main, _product)),
            companion=update(in_report(_second, _product) if _product.is_figure else _second),
        log:
            str(RESULTS / "{dataset}" / "logs" / f"{_product.name}.log"),
        conda:
            CONDA_ENV
        params:
            product=_product.name,
        script:
            "../scripts/render.py"

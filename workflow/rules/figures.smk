# Stage 5: every figure and table is one rule, one renderer module, one output, made from
# the raw JSON (and the fitted model) of one dataset. Figures are a PDF with a PNG beside it,
# tables a CSV with a Markdown copy. Outputs go into `snakemake --report`.
# Outputs are update(): Snakemake keeps the previous file until the job succeeds and puts it
# back when the job fails, so a failed rerun never deletes a committed reference figure.


for _product in layout.PRODUCTS.values():
    _kind, _ext, _companion = product_formats(_product)

    rule:
        name:
            f"{_kind[:-1]}_{_product.name.replace('-', '_')}"
        input:
            product_inputs(_product),
        output:
            main=update(
                report(
                    str(RESULTS / "{dataset}" / _kind / f"{_product.name}.{_ext}"),
                    caption=f"../report/{_product.name}.rst",
                    category="{dataset}",
                    subcategory=_kind,
                )
            ),
            companion=update(
                str(RESULTS / "{dataset}" / _kind / f"{_product.name}.{_companion}")
            ),
        params:
            product=_product.name,
        conda:
            CONDA_ENV
        log:
            str(RESULTS / "{dataset}" / "logs" / f"{_product.name}.log"),
        script:
            "../scripts/render.py"

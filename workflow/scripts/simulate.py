"""Rule entry point: simulate one raw file of a sim-* dataset from its hardware profile."""

from pathlib import Path

from xstage_bench.run.joblog import tee_to
from xstage_bench.sim import run

out = Path(snakemake.output[0])  # noqa: F821 (injected by Snakemake)
dataset, profile = snakemake.wildcards.dataset, snakemake.input.profile  # noqa: F821

with tee_to(snakemake.log[0]):  # noqa: F821
    if out.parent.name == "microbench":
        run.simulate_microbench(snakemake.config, profile, out.stem, dataset, str(out))  # noqa: F821
    elif out.stem == "megamoe":
        run.simulate_megamoe(snakemake.config, profile, dataset, str(out))  # noqa: F821
    elif out.stem == "megamoe_trace":
        run.simulate_megamoe_trace(snakemake.config, profile, dataset, str(out))  # noqa: F821
    elif out.stem == "attention":
        run.simulate_attention(snakemake.config, profile, dataset, str(out))  # noqa: F821
    else:
        raise ValueError(f"no simulator for {out}")

"""Rule entry point: play a dataset's MegaMoE arms through its fitted Burst-Gap drain."""

from pathlib import Path

from xstage_bench.report.analysis.megamoe_playback import write_playback
from xstage_bench.run.joblog import tee_to

with tee_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    out = Path(snakemake.output.playback)  # noqa: F821
    write_playback(out.parent.parent, out)  # results/<dataset>/model/megamoe_playback.json

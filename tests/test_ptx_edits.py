"""ptx_edits: the text edit itself, and its place in Triton's compilation."""

from __future__ import annotations

import importlib.util

import pytest

from xstage_kernels import ptx_edits

# As Triton 3.6 writes a partition's slot release and its next slot wait.
PTX = """\t.loc\t1 599 48
\tbar.sync \t0, 128;
\t@%p80 mbarrier.arrive.shared::cta.b64 _, [%r1309];
\tfma.rn.f32 \t%r2600, %r1335, %r1280, %r2600;
\tbar.sync \t0, 128;
\t// begin inline asm
\t
{
\t.reg .pred complete;
\twaitLoop:
\tmbarrier.try_wait.parity.shared.b64 complete, [%r1242], %r1243;
\t@!complete bra.uni waitLoop;
}
\tbar.sync \t1;
"""


def test_only_the_warpgroup_barrier_before_a_wait_is_dropped():
    edited, dropped = ptx_edits.drop_wait_barriers(PTX)
    assert dropped == 1
    assert edited.count("bar.sync \t0, 128;") == 1  # the release's barrier stays
    assert "@%p80 mbarrier.arrive" in edited and "mbarrier.try_wait" in edited
    assert "bar.sync \t1;" in edited  # a whole-CTA barrier is not a warpgroup's
    assert ptx_edits.drop_wait_barriers(edited) == (edited, 0)


def test_a_build_is_edited_only_when_its_ptx_carries_the_mark():
    assert ptx_edits.edited(PTX) == PTX
    marked = f"// {ptx_edits.DROP_WAIT_BARRIERS_MARK}\n{PTX}"
    assert ptx_edits.edited(marked) == ptx_edits.drop_wait_barriers(marked)[0] != marked


@pytest.mark.skipif(not importlib.util.find_spec("triton"), reason="triton not installed")
def test_the_hook_wraps_the_ptx_stage_after_any_hook_set_before(monkeypatch):
    from triton import knobs

    seen = []
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", lambda *a: seen.append(a))
    ptx_edits.install()
    ptx_edits.install()  # once: a second install does not wrap twice
    stages = {"ptx": lambda src, metadata: f"// {ptx_edits.DROP_WAIT_BARRIERS_MARK}\n{PTX}"}
    knobs.runtime.add_stages_inspection_hook(None, stages, None, None, 90)
    assert len(seen) == 1
    out = stages["ptx"](None, {})
    assert "mbarrier.try_wait" in out and out.count("bar.sync \t0, 128;") == 1

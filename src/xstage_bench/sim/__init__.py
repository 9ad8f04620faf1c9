"""The `sim` backend: discrete-event models driven by a hardware profile.

xstage.py   the X-Stage path (capacity Q, drain R, issue time T0) and the microbenchmarks;
megamoe.py  fused MoE tile schedules (expert waves, interleaved) against that path;
ulysses.py  Ulysses attention with its All-to-All alone, serial or fused;
run.py      the entry points the workflow calls; they write raw files tagged backend "sim".

Everything here is a model. Its output is labelled simulated wherever it appears and is
never presented as a measurement.
"""

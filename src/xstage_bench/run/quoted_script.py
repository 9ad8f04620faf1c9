"""A Python `script:` job runs from any path: the interpreter is quoted on its command line.

Snakemake 9.27 runs a Python `script:` as `{py_exec} {fname:q}`: the script's path is
quoted, the interpreter's is not (snakemake/snakemake#2645, open). In a clone whose path
holds a space, its virtual environment's python is such a path, and every script job
failed: "/usr/bin/bash: line 1: /tmp/rel: Is a directory", exit 126. `install()` quotes
it; the shell rules quote their own paths (`{output:q}`, common.smk's PYTHON).
"""

from __future__ import annotations

UNQUOTED = "{py_exec} "


def install() -> bool:
    """Quote the interpreter of Python script jobs; False where this Snakemake runs them
    some other way (nothing is changed then)."""
    try:
        from snakemake.script import PythonScript
    except ImportError:
        return False
    if getattr(PythonScript, "_xstage_quoted", False):
        return True
    if not hasattr(PythonScript, "_execute_cmd"):
        return False
    execute = PythonScript._execute_cmd

    def execute_quoted(self, cmd, **kwargs):
        if cmd.startswith(UNQUOTED):
            cmd = "{py_exec:q} " + cmd.removeprefix(UNQUOTED)
        return execute(self, cmd, **kwargs)

    PythonScript._execute_cmd = execute_quoted
    PythonScript._xstage_quoted = True
    return True

"""X-Stage bench's Snakemake plugin, a logger in name only.

Snakemake imports every installed plugin before it parses its command line, and reads
`--configfile` and `--config` before the Snakefile: this import is the one moment the
harness can explain what goes wrong there. It installs xstage_bench.run.snakemake_cli (config
files named with the line of a YAML error, a target after `--configfile` told to go first,
`--config a.b=v` as a nested key). Its log handler is used only when asked for
(`--logger xstage`) and logs nothing. Installed by `pip install ./plugins/snakemake-logger-
plugin-xstage` beside the harness; where the harness is absent it does nothing.
"""

from logging import LogRecord

from snakemake_interface_logger_plugins.base import LogHandlerBase

try:
    from xstage_bench.run.snakemake_cli import install
except ImportError:  # the plugin without the harness: Snakemake's own messages stand
    pass
else:
    install()


class LogHandler(LogHandlerBase):
    """Logs nothing: the plugin exists for its import (see the module doc)."""

    def emit(self, record: LogRecord) -> None:
        pass

    @property
    def writes_to_stream(self) -> bool:
        return False

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return False

    @property
    def has_formatter(self) -> bool:
        return False

    @property
    def needs_rulegraph(self) -> bool:
        return False

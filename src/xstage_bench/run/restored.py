"""A failed job's restored outputs are remade by the next run, never taken as current.

Outputs flagged `update()` (figures, tables, the model, measured raw files) are backed up
before their job runs and put back when it fails, so a failed rerun never deletes a
committed figure. Snakemake 9.27 puts the copy back with a new file time, then records the
failed job's metadata as if the job had finished: the next run takes the previous file as
current. Seen: with a tables folder made unwritable, tab-ulysses failed, "Restored previous
version", and after the fix the rerun said "Nothing to be done" while the table still
showed a sequence length its raw file no longer held.

`install()` changes Snakemake's persistence (the class, before the run uses it) in two
ways: the backup keeps the file's time (so the restored file is as old as it was), and an
output put back from its backup is marked incomplete once the failed job's metadata is
written, so the next run remakes it (`rerun-incomplete` is in the default profile; without
it Snakemake stops and names the file). tests/test_recovery.py pins the behaviour on the
pinned Snakemake; a Snakemake without these methods is left alone (`install` says so).
"""

from __future__ import annotations

import shutil
from pathlib import Path

_RESTORED = "_xstage_restored_outputs"


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=shutil.copy2, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def install() -> bool:
    """Patch Snakemake's persistence as the module docstring says; False where this
    Snakemake lacks the methods it relies on (nothing is changed then)."""
    try:
        from snakemake.persistence import PersistenceBase
    except ImportError:
        return False
    needed = ("backup_output", "restore_output", "finished", "_get_backup_path", "_get_key")
    if not all(hasattr(PersistenceBase, name) for name in needed):
        return False
    if getattr(PersistenceBase, "_xstage_installed", False):
        return True
    finished = PersistenceBase.finished

    def backup_output(self, path: Path) -> None:
        backup = self._get_backup_path(path)
        backup.parent.mkdir(parents=True, exist_ok=True)
        _copy(Path(path), backup)

    def restore_output(self, path: Path) -> bool:
        backup = self._get_backup_path(path)
        if not backup.exists():
            return _original_restore(self, path)  # Snakemake's warning names the file
        path = Path(path)
        if backup.is_dir() and path.exists():
            shutil.rmtree(path)
        _copy(backup, path)
        shutil.rmtree(backup) if backup.is_dir() else backup.unlink()
        self.__dict__.setdefault(_RESTORED, set()).add(str(path))
        return True

    async def finished_then_mark(self, job) -> None:
        await finished(self, job)
        restored = self.__dict__.get(_RESTORED, set())
        for f in job.output:
            if str(f) in restored:
                restored.discard(str(f))
                self._mark_incomplete(self._get_key(f), None)

    _original_restore = PersistenceBase.restore_output
    PersistenceBase.backup_output = backup_output
    PersistenceBase.restore_output = restore_output
    PersistenceBase.finished = finished_then_mark
    PersistenceBase._xstage_installed = True
    return True

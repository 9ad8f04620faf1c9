"""envs/offline-site.sh, the optional backends on a GPU machine with no package registry:
parts collected out of the repository as each call carries them, then installed into one
site with its exports. Tiny stand-in wheels and a packed site here; no network, no GPU."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "envs" / "offline-site.sh"


def _wheel(folder: Path, name: str) -> Path:
    """A minimal pure-Python wheel of module `name` (it defines WHO = name)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": f"WHO = {name!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for arcname, text in files.items():
            z.writestr(arcname, text)
    return path


def _split(data: bytes, stem: Path, parts: int) -> None:
    """data in `parts` pieces named stem + 'aa', 'ab', ... (as split(1) names them)."""
    size = -(-len(data) // parts)
    for i in range(parts):
        Path(f"{stem}a{chr(ord('a') + i)}").write_bytes(data[i * size : (i + 1) * size])


def _packed_site() -> bytes:
    """A FlashInfer site as envs/flashinfer-site.sh packs it (tar.xz), two modules inside."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for arcname in (
            "flashinfer_stub/__init__.py",
            "nvidia_cutlass_dsl/dsl_packages/dsl_stub.py",
        ):
            text = f"WHO = {arcname.split('/')[-2]!r}\n".encode()
            entry = tarfile.TarInfo(f"./{arcname}")
            entry.size = len(text)
            tar.addfile(entry, io.BytesIO(text))
    return buffer.getvalue()


def _run(args: list[str], carried: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XSTAGE_CARRIED": str(carried), "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture
def carried_calls(tmp_path):
    """What three calls carried, each collected before the next: the snakemake and fa4
    wheel groups, the fa4 compiler wheel in two parts, the FlashInfer site in two parts."""
    repo = tmp_path / "repo"
    _wheel(repo / "snakemake", "sm_stub")
    _wheel(repo / "fa4", "fa4_stub")
    lib = _wheel(tmp_path / "lib", "dsl_lib_stub")
    (repo / "fa4-lib").mkdir()
    _split(lib.read_bytes(), repo / "fa4-lib" / "part.", 2)
    (repo / "fa4-lib" / "wheel-name").write_text(lib.name + "\n")
    _split(_packed_site(), repo / "flashinfer-site.tar.xz.part.", 2)
    return repo, tmp_path / "carried"


def test_collected_parts_install_into_one_site_with_its_exports(carried_calls, tmp_path):
    repo, carried = carried_calls
    for paths in (["snakemake", "fa4"], ["fa4-lib"], ["flashinfer-site.tar.xz.part.aa"]):
        got = _run(["collect", *paths], carried, repo)
        assert got.returncode == 0, got.stderr
    got = _run(["collect", "flashinfer-site.tar.xz.part.ab"], carried, repo)
    assert got.returncode == 0, got.stderr
    site = tmp_path / "site"
    got = _run(["install", str(site)], carried, repo)
    assert got.returncode == 0, got.stderr
    said = got.stdout
    for line in ("installed snakemake", "not carried: fa3", "installed fa4"):
        assert line in said
    assert "unpacked flashinfer-site" in said and "not carried: deepgemm-src" in said
    exports = (site / "env.sh").read_text()
    assert "XSTAGE_DEEPGEMM_SITE" not in exports  # nothing carried, nothing claimed
    probe = (
        f". {site}/env.sh && {sys.executable} -c '"
        "import os, sys, sm_stub, fa4_stub, dsl_lib_stub; "
        'sys.path[:0] = os.environ["XSTAGE_FLASHINFER_SITE"].split(":"); '
        "import flashinfer_stub, dsl_stub; print(sm_stub.WHO, dsl_lib_stub.WHO, dsl_stub.WHO)'"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run(
        ["bash", "-c", probe], env=env, capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["sm_stub", "dsl_lib_stub", "dsl_packages"]


def test_a_path_not_carried_and_an_empty_collection_are_named(tmp_path):
    got = _run(["collect", "fa3"], tmp_path / "carried", tmp_path)
    assert got.returncode == 1 and "fa3 was not carried" in got.stderr
    got = _run(["install", str(tmp_path / "site")], tmp_path / "carried", tmp_path)
    assert got.returncode == 1 and "nothing collected in" in got.stderr
    got = _run(["unpack"], tmp_path / "carried", tmp_path)
    assert got.returncode == 1 and "usage:" in got.stderr

"""The bench records which llmbatch it ran, so a side by side can be checked."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import llmbatch
from llmbatch_bench import provenance


def test_the_digest_follows_the_source_not_where_it_lies(tmp_path: Path) -> None:
    package = Path(llmbatch.__file__).parent
    copy = tmp_path / "llmbatch"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert provenance.source_digest(copy) == provenance.source_digest(package)
    module = copy / "_control" / "admission.py"
    module.write_text(module.read_text() + "\n# one line more\n")
    assert provenance.source_digest(copy) != provenance.source_digest(package)


def test_a_bench_started_in_a_checkout_records_that_checkouts_llmbatch(
    tmp_path: Path,
) -> None:
    # python -m puts the directory it starts in first on sys.path, ahead of
    # PYTHONPATH: the record must name the package actually imported.
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copytree(
        Path(llmbatch.__file__).parent,
        checkout / "llmbatch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from llmbatch_bench import provenance; print(provenance.code()['path'])",
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert Path(done.stdout.strip()) == (checkout / "llmbatch").resolve()


def test_the_record_names_version_path_and_source() -> None:
    record = provenance.code()
    assert record["version"] == llmbatch.__version__
    assert Path(record["path"]) == Path(llmbatch.__file__).resolve().parent
    assert len(record["source"]) == 16
    assert provenance.describe(record).startswith(f"llmbatch {llmbatch.__version__} from ")

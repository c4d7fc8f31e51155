"""Load a script of this repository (examples/, benchmarks/) as a module, by its path, or run one
in a process of its own under a Keras backend."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script(relpath: str) -> ModuleType:
    """``load_script("benchmarks/reader.py")``: the script run as a fresh module (off sys.path)."""
    name = "mpwatch_script_" + relpath.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_fit_script(script: Path, out: Path, backend: str, **env_extra: str) -> dict:
    """``python SCRIPT OUT`` with ``KERAS_BACKEND=backend`` on the CPU (Keras fixes its backend at
    import: the test session cannot switch), asserting it succeeded; returns the ``facts.json`` it
    wrote into ``out``."""
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **env_extra,
    }
    proc = subprocess.run(
        [sys.executable, str(script), str(out)], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((Path(out) / "facts.json").read_text())

"""The layout tells the data flow: record -> contract -> read -> judge -> show, and has no circle.

The import graph is read from the source with :mod:`ast` (every ``import`` statement, also those
inside functions), not by importing, so a lazy import cannot hide an edge.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"mpwatch": ROOT / "mpwatch", "tensorboard_plugin_mpwatch": ROOT / "tensorboard_plugin"}

# stage -> the mpwatch stages it may import (shared facts: contract, formats, layers, the kernel
# name catalogue and rules of mpwatch.profile; how values are written: words)
SHARED = (
    "mpwatch",
    "mpwatch._version",
    "mpwatch.contract",
    "mpwatch.formats",
    "mpwatch.layers",
    "mpwatch.profile.kernel_classes",
    "mpwatch.profile.kernel_patterns",
    "mpwatch.user_cache",
    "mpwatch.wire",
    "mpwatch.words",
)
ALLOWED = {
    "mpwatch.record": (*SHARED, "mpwatch.profile", "mpwatch.record"),
    # read: a run holding only a raw profiler trace gets its profile through the converter
    # (read/traces.py, lazily: only for a trace without a record)
    "mpwatch.read": (*SHARED, "mpwatch.profile", "mpwatch.read"),
    "mpwatch.judge": (*SHARED, "mpwatch.read", "mpwatch.judge"),
    "mpwatch.show": (*SHARED, "mpwatch.read", "mpwatch.judge", "mpwatch.show"),
    # the pre-flight records a model under candidate policies, reads and judges those runs and
    # shows its report: the stage after show (and the command line's entry, mpwatch/__main__)
    "mpwatch.launch": (
        *SHARED, "mpwatch.profile", "mpwatch.record", "mpwatch.read", "mpwatch.judge",
        "mpwatch.show", "mpwatch.launch",
    ),
    "mpwatch.contract": ("mpwatch.contract",),
    "mpwatch.formats": (),
    "mpwatch.layers": (),
    "mpwatch.user_cache": (),
    "mpwatch.wire": (),
    "mpwatch.words": (),
    "mpwatch.profile": (
        "mpwatch.contract",
        "mpwatch.formats",
        "mpwatch.layers",
        "mpwatch.profile",
        "mpwatch.wire",
        "mpwatch.words",
    ),
    # the tab shows what the reports show: the views both build from a Run (memory by dtype,
    # float8 readiness, what the profile could not join, the loss scale from the first step, the
    # skipped steps, the underflow heatmap) are written once, in mpwatch.show.views (show
    # imports nothing of the plugin)
    "tensorboard_plugin_mpwatch": (
        *SHARED,
        "mpwatch.read",
        "mpwatch.judge",
        "mpwatch.show.views",
        "tensorboard_plugin_mpwatch",
    ),
}


def _modules() -> dict[str, Path]:
    out = {}
    for top, base in SOURCES.items():
        pkg_root = base / top if top != "mpwatch" else base
        for path in sorted(pkg_root.rglob("*.py")):
            rel = path.relative_to(pkg_root).with_suffix("")
            parts = [top, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The mpwatch modules ``name`` imports (a ``from pkg import x`` names module ``pkg.x`` when
    that is a module, else ``pkg``)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _stage(module: str) -> str | None:
    for stage in sorted(ALLOWED, key=len, reverse=True):
        if module == stage or module.startswith(stage + "."):
            return stage
    return None


def test_the_stages_are_packages_of_their_own():
    for pkg in ("mpwatch.record", "mpwatch.read", "mpwatch.judge", "mpwatch.show"):
        assert pkg in MODULES, pkg
    flat = sorted(n for n in MODULES if n.count(".") == 1 and n.startswith("mpwatch."))
    assert flat == [
        "mpwatch.__main__",
        "mpwatch._version",
        "mpwatch.contract",
        "mpwatch.formats",
        "mpwatch.judge",
        "mpwatch.launch",
        "mpwatch.layers",
        "mpwatch.profile",
        "mpwatch.read",
        "mpwatch.record",
        "mpwatch.show",
        "mpwatch.user_cache",
        "mpwatch.wire",
        "mpwatch.words",
    ]


def test_no_import_circle():
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                circle = stack[stack.index(nxt) :] + [nxt]
                pytest.fail("import circle: " + " -> ".join(circle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _stage(m)))
def test_each_stage_imports_only_what_comes_before_it(module):
    stage = _stage(module)
    allowed = ALLOWED[stage]
    # the package root is allowed only as itself (its lazy exports reach every stage), not as
    # the prefix of every module
    wrong = sorted(
        m
        for m in GRAPH[module]
        if not any(m == a or (a != "mpwatch" and m.startswith(a + ".")) for a in allowed)
    )
    assert not wrong, f"{module} ({stage}) imports {wrong}; it may import {allowed}"


def test_record_never_imports_read_even_lazily():
    record = [m for m in MODULES if m.startswith("mpwatch.record")]
    assert record
    for m in record:
        assert not {x for x in GRAPH[m] if x.startswith("mpwatch.read")}, m


def test_importing_the_recorder_loads_no_read_module():
    code = (
        "import sys, mpwatch.record.callbacks.monitor, mpwatch.record.callbacks.loop; "
        "bad = sorted(m for m in sys.modules if m.startswith(('mpwatch.read', 'mpwatch.judge', "
        "'mpwatch.show'))); print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


def test_old_module_paths_are_gone():
    """The layout before record / read / judge / show was never released: no import hook keeps
    its module paths alive (``mpwatch.reader``, ``mpwatch.callbacks``, ``mpwatch.advisor``)."""
    import mpwatch

    assert not [f for f in sys.meta_path if type(f).__module__.startswith("mpwatch")]
    for old in ("mpwatch.reader", "mpwatch.callbacks.monitor", "mpwatch.advisor", "mpwatch.report"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    assert mpwatch.load_run and mpwatch.diagnose and mpwatch.MixedPrecisionMonitor


#: a module a reader can hold in mind: split by responsibility before it grows past this
MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for base in SOURCES.values()
        for p in base.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, long


def test_the_package_root_holds_the_api_the_contract_and_shared_facts():
    """The stages and the profile are folders; at the root only the public API, the contract and
    the facts every stage shares."""
    root = sorted(p.name for p in (ROOT / "mpwatch").iterdir() if p.name != "__pycache__")
    assert root == [
        "__init__.py",
        "__main__.py",
        "_version.py",
        "contract",
        "formats.py",
        "judge",
        "launch",
        "layers.py",
        "profile",
        "read",
        "record",
        "show",
        "user_cache.py",
        "wire.py",
        "words.py",
    ], root


#: a folder a reader can take in at a glance: split into wings before it grows past this
MAX_FOLDER_MODULES = 15
#: the rules catalogue: one rule a file, each declaring itself (judge/declare.py), read as a list
CATALOGUES = {ROOT / "mpwatch" / "judge" / "rules"}


def test_no_package_folder_holds_more_than_15_modules():
    crowded = {
        str(folder.relative_to(ROOT)): n
        for base in SOURCES.values()
        for folder in [base, *(p for p in base.rglob("*") if p.is_dir())]
        if folder.name != "__pycache__" and folder not in CATALOGUES
        if (n := len([p for p in folder.glob("*.py") if p.name != "__init__.py"]))
        > MAX_FOLDER_MODULES
    }
    assert crowded == {}, crowded


def test_the_record_stage_is_in_wings():
    """The record stage's modules live in its wings; only the package itself sits at its root."""
    record = ROOT / "mpwatch" / "record"
    assert sorted(p.name for p in record.glob("*.py")) == ["__init__.py"]
    wings = sorted(p.name for p in record.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert wings == ["callbacks", "model", "probe", "runtime", "tap"], wings


def test_the_reports_and_the_tab_take_their_views_from_one_module():
    """Every view both show is computed once (mpwatch.show.views) and imported from its package,
    by the reports and by the tab alike; no one reaches past it into its modules."""
    views = "mpwatch.show.views"
    inside = {m for m in MODULES if m == views or m.startswith(views + ".")}
    past = {
        m: sorted(d for d in GRAPH[m] if d.startswith(views + "."))
        for m in MODULES
        if m not in inside
    }
    assert {m: d for m, d in past.items() if d} == {}
    plugin = "tensorboard_plugin_mpwatch.data"
    users = ("mpwatch.show.html", "mpwatch.show.report", f"{plugin}.views", f"{plugin}.scalars")
    for user in users:
        assert views in GRAPH[user], user

"""How fast is the "Mixed Precision" tab on a long, wide run?

Builds a synthetic run of ``--steps`` steps (default 100,000) of a ``--layers``-layer model (default
500) with ``--probes`` probe records, using ``build_logdir`` of ``benchmarks/reader.py`` (the events
``RunWriter`` writes, written directly because 100,000 steps through TensorFlow take minutes).
Starts a real ``tensorboard --logdir`` and times:

- each JSON route: cold (nothing cached: TensorBoard's data provider read + the reader's Run + the
  advisor + the view; once per run version) and the median of ``--repeat`` calls after it ("after
  load"; each still checks the run's version with the data provider);
- headless Chromium: from navigating to ``/#mpwatch`` until the layer table is rendered (a fresh
  page each time; the first after the routes are warm is what a user waits when opening the tab).

Goals: at most 300 ms per route after load, 2 s until the tab is rendered.

    python benchmarks/plugin.py
    python benchmarks/plugin.py --steps 20000 --layers 100   # quicker
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from tensorboard_plugin_mpwatch.plugin import LISTING_TTL_S

HERE = os.path.dirname(os.path.abspath(__file__))
ROUTES = ("runs", "scalars", "layers", "probes", "findings", "profile")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _build_logdir():
    spec = importlib.util.spec_from_file_location(
        "mpwatch_bench_reader", os.path.join(HERE, "reader.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_logdir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        body = r.read()
    return time.perf_counter() - t, body


def _wait_loaded(base: str, steps: int, probes: int, proc: subprocess.Popen, timeout: float):
    """Until TensorBoard has read the whole run (last step and every probe record)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tensorboard exited with {proc.returncode}")
        try:
            _, body = _get(base + "/data/plugin/mpwatch/runs")
            runs = json.loads(body)["runs"]
            if runs and runs[0]["max_step"] >= steps:
                _, body = _get(base + "/data/plugin/mpwatch/probes?run=run")
                if len(json.loads(body)["steps"]) >= probes:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"tensorboard did not load the run within {timeout} s")


def time_routes(base: str, repeat: int) -> list[tuple[str, float, float, int]]:
    rows = []
    for route in ROUTES:
        query = "" if route == "runs" else "?run=run"
        # cold: under a fresh experiment id the plugin has nothing cached for this run (the local
        # data provider ignores the id): data-provider read + the reader's Run + advisor + view
        first, body = _get(f"{base}/experiment/cold-{route}/data/plugin/mpwatch/{route}{query}")
        url = f"{base}/data/plugin/mpwatch/{route}{query}"
        _get(url)
        warm = []
        for _ in range(repeat):
            time.sleep(LISTING_TTL_S + 0.05)  # each call pays the run listing (its version check)
            warm.append(_get(url)[0])
        rows.append((route, first, statistics.median(warm), len(body)))
    return rows


def time_render(base: str, pages: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for _ in range(pages):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t = time.perf_counter()
            page.goto(f"{base}/#mpwatch")
            page.wait_for_selector('iframe[src*="plugin_entry.html?name=mpwatch"]')
            frame = None
            while frame is None:
                frame = next((f for f in page.frames if "name=mpwatch" in f.url), None)
                if frame is None:
                    page.wait_for_timeout(10)
            frame.wait_for_selector("#mpw-layer-table tbody tr", timeout=120_000)
            frame.wait_for_selector("#mpw-loss-scale svg path.mpw-line")
            total = time.perf_counter() - t
            own = frame.evaluate(
                "performance.getEntriesByName('mpwatch-rendered')[0].startTime / 1000"
            )
            times.append((total, own))
            page.close()
        browser.close()
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=500)
    ap.add_argument("--probes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--pages", type=int, default=3)
    ap.add_argument("--logdir", help="build here (kept) instead of a temporary directory")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="mpwatch-bench-plugin-")
    root = args.logdir or os.path.join(tmp, "logs")
    proc = None
    log = open(os.path.join(tmp, "tensorboard.log"), "w")  # noqa: SIM115
    try:
        t = time.perf_counter()
        truth = _build_logdir()(os.path.join(root, "run"), args.steps, args.probes, args.layers)
        print(
            f"built {root}/run: {args.steps:,} steps, {truth['scalar_events']:,} scalar events, "
            f"{truth['probes']} probes of {truth['layers']} layers, "
            f"{truth['bytes'] / 2**20:.1f} MiB in {time.perf_counter() - t:.1f} s"
        )
        port = _free_port()
        exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
        cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "tensorboard.main"]
        cmd += ["--logdir", root, "--host", "127.0.0.1", "--port", str(port)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        base = f"http://127.0.0.1:{port}"
        _wait_loaded(base, args.steps, truth["probes"], proc, timeout=600)
        print(f"tensorboard up and the run loaded in {time.perf_counter() - t:.1f} s")

        print(f"{'route':10} {'cold (ms)':>11} {'after load, median (ms)':>24} {'bytes':>10}")
        worst = 0.0
        for route, first, warm, size in time_routes(base, args.repeat):
            worst = max(worst, warm)
            print(f"{route:10} {first * 1e3:11.1f} {warm * 1e3:24.1f} {size:10,}")
        print(f"slowest route after load: {worst * 1e3:.1f} ms (goal <= 300 ms)")

        if not os.path.exists(CHROMIUM):
            print(f"{CHROMIUM} missing: render time not measured")
            return 0
        renders = time_render(base, args.pages)
        totals = [r[0] for r in renders]
        owns = [r[1] for r in renders]
        print(
            "navigation to /#mpwatch until the table and charts show (TensorBoard's own page "
            "included), per fresh page: "
            + ", ".join(f"{r:.2f} s" for r in totals)
            + f"; median {statistics.median(totals):.2f} s"
        )
        print(
            "the tab itself (plugin iframe document start until rendered), per page: "
            + ", ".join(f"{r:.2f} s" for r in owns)
            + f"; median {statistics.median(owns):.2f} s (goal <= 2 s)"
        )
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

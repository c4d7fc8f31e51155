"""A real ``tensorboard`` process on 127.0.0.1 for the tests: started on a free port, waited for
with a bounded wait, always stopped."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_tensorboard(
    logdir: str,
    log_path: str,
    ready: Callable[[str], object],
    timeout: float = 180.0,
    extra_args: tuple[str, ...] = (),
) -> Iterator[tuple[str, int, subprocess.Popen]]:
    """Yields ``(base_url, port, process)`` once ``ready(base_url)`` is truthy.

    ``ready`` may raise OSError/ValueError/AssertionError while the server is coming up. Raises
    RuntimeError (with the log's tail) if TensorBoard exits, TimeoutError after ``timeout``.
    """
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "tensorboard.main"]
    cmd += ["--logdir", logdir, "--host", "127.0.0.1", "--port", str(port), *extra_args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + timeout
            last: Exception | None = None
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(
                        f"tensorboard exited with {proc.returncode}:\n{log.read()[-3000:]}"
                    )
                try:
                    if ready(base):
                        break
                except (OSError, ValueError, AssertionError) as e:
                    last = e
                if time.monotonic() > deadline:
                    log.seek(0)
                    raise TimeoutError(
                        f"tensorboard not ready in {timeout:g}s (last error {last!r}):\n"
                        f"{log.read()[-3000:]}"
                    )
                time.sleep(0.5)
            yield base, port, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)

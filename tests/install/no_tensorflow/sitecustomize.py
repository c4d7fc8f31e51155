"""A machine without TensorFlow, for tests/install/test_without_tensorflow.py: put this folder on
PYTHONPATH and every import of tensorflow fails as it does where TensorFlow is not installed."""

import importlib.abc
import sys


class _NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201, ARG002
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTensorFlow())

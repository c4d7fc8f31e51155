"""Shared fixtures. TensorFlow is slow to import and models are slow to train on 2 cores: train once
per session and share the logdirs."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")

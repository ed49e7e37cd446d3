"""Shared test set-up: keep torch small and quiet on the 2-core CI machine."""

from __future__ import annotations

import torch

torch.set_num_threads(1)

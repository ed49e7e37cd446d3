"""The levers' probes run at a workload's own shapes (`Lever.probe`): a lever whose value is a
kernel choice is settled in seconds by timing that kernel on the calls one forward makes, where
a trial compiles and runs the whole step.

The forward runs as a training step runs it (gradients on, under the run's autocast), on the
first batch, on the device the runs use; the model goes back to where it was found. No backward
runs, so no gradient is touched, and the graph is freed when the forward's result is.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable

import torch

from trainers.flops import first_batch
from trainers.levers import LEVERS
from trainers.levers.declare import ProbeInput, Value
from trainers.precision import Precision, make_plan
from trainers.workloads import Workload

Probed = dict[str, dict[Value, float | str]]
"""Each probed lever's figures by value (`trainers.levers.declare.Probe`)."""


def probe_levers(
    workload: Workload,
    names: Iterable[str],
    *,
    device: torch.device,
    precision: Precision | None,
) -> Probed:
    """The probes of the levers `names` that have one, at `workload`'s shapes on `device` in
    `precision`; the levers without a probe are left out."""
    probes = {name: LEVERS[name].probe for name in names}
    chosen = {name: probe for name, probe in probes.items() if probe is not None}
    if not chosen:
        return {}
    model = workload.model
    home = next((p.device for p in model.parameters()), device)
    try:
        model.to(device)
        batch = tuple(
            t.to(device) if isinstance(t, torch.Tensor) else t for t in first_batch(workload)
        )
        plan = make_plan(precision, device)

        def forward() -> object:
            with plan.autocast():
                return workload.loss_fn(model, batch)

        where = ProbeInput(forward=forward, device=device, model=model, autocast=plan.autocast)
        return {name: probe(where) for name, probe in chosen.items()}
    finally:
        model.to(home)
        # What the probes allocated goes back to the device: the search process holds no memory
        # while the gate's and the profiles' children run (`Measurer._give_back`).
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

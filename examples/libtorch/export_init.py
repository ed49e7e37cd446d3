"""Write the Python built-in's initial weights and data for the LibTorch trainer's `--init`.

    python export_init.py --preset small --seed 0 --out init.pt

The file is `torch.save({"params": {name: tensor}, "src", "tgt_in", "tgt_out"})` of
`trainers.workloads.transformer.build(preset, seed=seed)`: the C++ trainer then starts from the
very weights and batches the Python loop starts from, so their losses can be compared step for
step (`benchmarks/libtorch_seed.py`, `tests/examples/test_libtorch.py`). Parameter names are the
module paths, which the C++ model registers under the same names.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from trainers.workloads import transformer


def export(preset: str, seed: int, out: Path) -> Path:
    workload = transformer.build(preset, seed=seed)
    params = {name: p.detach().cpu().contiguous() for name, p in workload.model.named_parameters()}
    src, tgt_in, tgt_out = workload.dataset.tensors  # type: ignore[attr-defined]
    torch.save({"params": params, "src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(transformer.PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("init.pt"))
    args = parser.parse_args()
    print(export(args.preset, args.seed, args.out))


if __name__ == "__main__":
    main()

"""EM routing in float32 against float64: how much of the difference is the float32 computation's, and how
much the input's own rounding, over the property test's ranges (tests/test_properties.py).

    python experiments/em_float32.py            # writes experiments/results/em_float32.md and .json
    python experiments/em_float32.py --report   # the page from its record

For each seed and each setting of the property test (an offset added to every vote, the votes' spread around
it, the cost normalisation, the final inverse temperature), the gradient of a fixed loss on EM's poses and
activations with respect to the votes, three ways: float64 on the exact inputs; float64 on the inputs rounded
to float32 (what a float32 computation receives); float32 on those. The first against the second is the
problem's condition times float32's rounding of the inputs, which no float32 computation can avoid; the
second against the third is the float32 computation's own error.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import sys
from pathlib import Path

import torch

from capsexp.records.machine import cpu_name
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)
sys.path.insert(0, str(PROJECT_ROOT))
from tests.em_reference import fast_em_routing  # noqa: E402
from tests.test_properties import EM_FLOAT32_SETTINGS, em_float32_case  # noqa: E402

PAGE = PROJECT_ROOT / "experiments" / "results" / "em_float32.md"
RECORD = PAGE.with_suffix(".json")
SEEDS = 300


def gradients(inputs: tuple, options: dict, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    votes, activations, beta_u, beta_a, upstream = inputs
    leaf = votes.to(dtype).requires_grad_()
    mu, a = fast_em_routing(leaf, activations.to(dtype), beta_u.to(dtype), beta_a.to(dtype), **options)
    (grad,) = torch.autograd.grad((mu, a), leaf, [u.to(dtype) for u in upstream])
    return mu.detach().double(), a.detach().double(), grad.double()


def measure(seeds: int) -> list[dict]:
    rows = []
    for seed, setting in itertools.product(range(seeds), itertools.product(*EM_FLOAT32_SETTINGS.values())):
        options = dict(zip(EM_FLOAT32_SETTINGS, setting, strict=True))
        inputs, routing = em_float32_case(seed, **options)
        rounded = tuple(
            x.float().double() if torch.is_tensor(x) else tuple(u.float().double() for u in x) for x in inputs
        )
        exact, rounded64, rounded32 = (
            gradients(inputs, routing, torch.float64),
            gradients(rounded, routing, torch.float64),
            gradients(rounded, routing, torch.float32),
        )
        norm = float(exact[2].norm())
        rows.append(
            {
                "seed": seed,
                **options,
                "total": float((rounded32[2] - exact[2]).norm()) / norm,
                "input rounding": float((rounded64[2] - exact[2]).norm()) / norm,
                "float32 computation": float((rounded32[2] - rounded64[2]).norm() / rounded64[2].norm()),
                "poses": float((rounded32[0] - rounded64[0]).abs().max()),
                "activations": float((rounded32[1] - rounded64[1]).abs().max()),
            }
        )
    return rows


COLUMNS = ("seed", *EM_FLOAT32_SETTINGS, "total", "input rounding", "float32 computation", "poses", "activations")


def compact(record: dict) -> str:
    """The record with its rows as lists under one header, errors to 3 significant digits (the page's 2)."""
    rows = [
        [float(f"{r[c]:.3g}") if isinstance(r[c], float) and c not in EM_FLOAT32_SETTINGS else r[c] for c in COLUMNS]
        for r in record["rows"]
    ]
    head = json.dumps({**record, "rows": None, "columns": COLUMNS})
    body = ",\n".join(json.dumps(row) for row in rows)
    return head.replace('"rows": null', f'"rows": [\n{body}\n]') + "\n"


def page(record: dict) -> str:
    rows = [dict(zip(record["columns"], row, strict=True)) for row in record["rows"]]
    worst = max(rows, key=lambda r: r["total"])
    computation = max(rows, key=lambda r: r["float32 computation"])
    table = []
    for offset, spread in itertools.product(EM_FLOAT32_SETTINGS["offset"], EM_FLOAT32_SETTINGS["spread"]):
        group = [r for r in rows if r["offset"] == offset and r["spread"] == spread]
        table.append(
            f"| {offset:g} | {spread:g} | {abs(offset) * 2**-24 / spread if offset else 0:.1e} | "
            + " | ".join(
                f"{max(r[key] for r in group):.1e}" for key in ("total", "input rounding", "float32 computation")
            )
            + " |"
        )
    table_text = "\n".join(table)
    cases = len(rows)
    test = "test_em_float32_matches_float64_on_the_same_inputs"
    poses = max(rows, key=lambda r: r["poses"])
    poses_narrow = max(r["poses"] for r in rows if r["spread"] == min(EM_FLOAT32_SETTINGS["spread"]))
    activations = max(r["activations"] for r in rows)
    header = (
        "| offset | spread | input perturbation relative to the spread | largest total | from the inputs' rounding "
        "| from the float32 computation |"
    )
    return f"""# EM routing in float32: the computation's error and the input's

Written by `experiments/em_float32.py` on {record["date"]}: {record["machine"]}, Python {record["python"]},
torch {record["torch"]}, {record["minutes"]:.1f} min.

**Over {cases} cases ({record["seeds"]} seeds x every setting of `{test}`), EM's
float32 gradient differs from float64's on the same float32 inputs by at most
{computation["float32 computation"]:.1e} (relative norm); the largest difference from float64 on the exact inputs,
{worst["total"]:.1e} (seed {worst["seed"]}, offset {worst["offset"]:g}, spread {worst["spread"]:g},
`{worst["cost_normalization"]}`, final lambda {worst["final_lambda"]:g}), is the inputs' rounding: float64 on the
rounded inputs is {worst["input rounding"]:.1e} from it.** On the same inputs, float32's poses differ from
float64's by at most {poses["poses"]:.1e} (largest at spread {poses["spread"]:g}; at
spread 0.01 at most {poses_narrow:.1e}), its activations by {activations:.1e}.

The votes are `offset + spread x N(0, 1)`. float32 stores a vote to a relative 2^-24, so an offset of 50 moves
each by up to 3e-6, a third of a thousandth of a spread of 0.01: the routing sees votes whose differences (what
its variances and costs are made of) are perturbed by `|offset| 2^-24 / spread` of themselves, and the sharp
costs (final lambda 10, standardised costs) amplify that about tenfold in the gradient. That is the input's
condition, the same in any float32 computation; the float32 computation's own error is the column to its right.

{header}
| ---: | ---: | ---: | ---: | ---: | ---: |
{table_text}

What this shows: over the property test's ranges, a float32 EM routing's gradient is within
{computation["float32 computation"]:.1e} of float64's on the same inputs; where it is further from float64 on
exact inputs, float64 itself is as far once the inputs are rounded. What it does not show: inputs outside these
ranges (larger offsets, fewer children, more iterations), or the bf16 path.

Run again: `python experiments/em_float32.py` (about {record["minutes"]:.0f} min); this page from its record:
`python experiments/em_float32.py --report`.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--report", action="store_true", help="write the page from its record, without running")
    args = parser.parse_args()
    if args.report:
        record = json.loads(RECORD.read_text())
    else:
        torch.set_num_threads(1)
        with Stopwatch() as watch:
            rows = measure(args.seeds)
        record = {  # the rows as dicts here; compact() writes them as lists under "columns"
            "date": str(datetime.date.today()),
            "machine": f"{cpu_name()}, {os.cpu_count()} cores",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "minutes": watch.seconds / 60,
            "seeds": args.seeds,
            "rows": rows,
        }
        RECORD.write_text(compact(record))
        record = json.loads(RECORD.read_text())  # the page from the record as kept, as --report writes it
    PAGE.write_text(page(record))
    print(f"em_float32: wrote {PAGE.relative_to(PROJECT_ROOT)}")


if __name__ == "__main__":
    main()

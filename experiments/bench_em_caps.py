"""EM-capsule (MatrixCapsNet) speed and memory benchmark; writes experiments/results/bench_em.md.

The smallNORB network (A=B=C=D=32, K=3, 4x4 poses) under the routing options of model=em_caps and of
model=em_caps_paper, on 2x32x32 inputs with
5 classes. Each batch size runs in its own process, so that its peak RSS is its own (counted from
after the net is built). Routing's share is the CPU time of the profiled ``em_routing`` calls (forward,
the autograd nodes they created and every operation run inside those) over the whole step, from one
extra profiled step; the peak RSS is read before it.

    python experiments/bench_em_caps.py                     # batch 8 and 32, model=em_caps and em_caps_paper
    python experiments/bench_em_caps.py --batch-sizes 8     # one size
    python experiments/bench_em_caps.py --accuracy          # + a fixed number of MNIST steps via the CLI
    python experiments/bench_em_caps.py --baseline HEAD     # + the net of a git revision, side by side

``--baseline REV`` imports the package as ``src/`` is at git revision REV beside this tree's, builds
the net with it (the same weights) and, in one process per row, interleaves training steps of the two
nets on the same batch; each one's peak RSS comes from processes of its own.
``--baseline-name`` says on the page what REV is (the page names no revision: it outlives them).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import types
from pathlib import Path

import torch

from benchlib import cli_test_accuracy
from capsexp.records.machine import cpu_name
from revisions import tree_at
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

RESULTS = PROJECT_ROOT / "experiments" / "results" / "bench_em.md"
# A whole epoch of MNIST takes hours on 2 CPU cores: a fixed number of steps, then the full test set.
ACCURACY_STEPS = 300
ACCURACY_COMMAND = [
    "model=em_caps",
    "data=mnist",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    f"trainer.limit_train_batches={ACCURACY_STEPS}",
    "trainer.val_check_interval=1.0",
    "trainer.limit_val_batches=20",
    "trainer.accelerator=cpu",
]


RECIPES = {"default": "em_caps", "paper": "em_caps_paper"}  # recipe: its model config


def net_options(recipe: str) -> dict:
    """The MatrixCapsNet arguments of a model config (A=B=C=D=32), composed and built as the CLI does
    (``routing`` an EMRouting), less the data geometry."""
    from hydra.utils import instantiate

    from capsexp.config.hydra_setup import compose

    net = compose([f"model={RECIPES[recipe]}"]).model.net
    arguments = instantiate(net, _partial_=True, _convert_="all").keywords
    return {key: value for key, value in arguments.items() if key not in ("in_channels", "image_size", "num_classes")}


def recipe_text(recipe: str) -> str:
    """What sets a recipe's routing apart, read from its composed config."""
    options = net_options(recipe)
    routing = options["routing"]
    return (
        f"{RECIPES[recipe]}: {routing.iterations} EM iterations, E-step temperature {routing.e_step_temperature:g}, "
        f"{'' if options['conv1_norm'] else 'no '}BatchNorm after conv1"
    )


RSS_PROCESSES = 5  # per implementation, with --baseline
RSS_STEPS = 6  # training steps per peak-RSS process: past the second, the peak grows by under 1%


def package_at(revision: str) -> types.SimpleNamespace:
    """capsexp as ``src/`` is at a git revision, imported beside this tree's: its MatrixCapsNet, EMRouting and
    em_routing, and ``active()``, a context in which ``capsexp`` names that revision's package. What it builds
    and runs must run inside it: a layer resolves its router by name (``"capsexp.nn.routers:..."``) when it
    is built, and a function may import where it is called, which would otherwise find this tree's modules."""
    root = tree_at(revision, "src")
    theirs: dict[str, types.ModuleType] = {}

    @contextlib.contextmanager
    def active():
        ours = {name: sys.modules.pop(name) for name in list(sys.modules) if name.partition(".")[0] == "capsexp"}
        sys.modules.update(theirs)
        sys.path.insert(0, str(root / "src"))
        try:
            yield
        finally:
            sys.path.remove(str(root / "src"))
            for name in [name for name in sys.modules if name.partition(".")[0] == "capsexp"]:
                theirs[name] = sys.modules.pop(name)
            sys.modules.update(ours)

    with active():
        models = importlib.import_module("capsexp.models")
        functional = importlib.import_module("capsexp.nn.functional")
        options = importlib.import_module("capsexp.nn")
    return types.SimpleNamespace(
        MatrixCapsNet=models.MatrixCapsNet, EMRouting=options.EMRouting, em_routing=functional.em_routing, active=active
    )


def baseline_routing(revision: str):
    """``em_routing`` of a git revision's package, called as today's is; options it does not know
    (added since) are dropped, and options left unset (None: today's default) are not passed, so that
    the revision applies its own default."""
    package = package_at(revision)
    module_routing = package.em_routing
    known = inspect.signature(module_routing).parameters

    def em_routing(votes, activations, beta_u, beta_a, routing, **kwargs):
        with package.active():
            if "routing" in known:
                return module_routing(votes, activations, beta_u, beta_a, routing, **kwargs)
            # A revision whose em_routing took the options one by one.
            options = {**dataclasses.asdict(routing), **kwargs}
            given = {k: v for k, v in options.items() if k in known and v is not None}
            return module_routing(votes, activations, beta_u, beta_a, **given)

    return em_routing


def baseline_option(routing, name: str):
    """An option of today's routing as an older EMRouting takes it: a variance floor left unset (None: the
    layers' floor) given as the number it stands for."""
    from capsexp.nn.functional._em_routing import variance_floor

    value = getattr(routing, name)
    return variance_floor(routing) if name == "sigma_eps" and value is None else value


def training_step(batch_size: int, recipe: str, revision: str | None = None):
    """The net of a recipe and one training step of it (forward, spread loss, backward, Adam): the net
    as this tree builds it, or as a git revision's package does (with the same weights)."""
    from capsexp.models import MatrixCapsNet
    from capsexp.nn.functional import spread_loss

    torch.manual_seed(0)
    options = net_options(recipe)
    net = MatrixCapsNet(in_channels=2, num_classes=5, image_size=32, **options)
    images, targets = torch.rand(batch_size, 2, 32, 32), torch.randint(0, 5, (batch_size,))
    within = contextlib.nullcontext
    if revision is not None:
        package = package_at(revision)
        known = inspect.signature(package.MatrixCapsNet).parameters
        routing = options["routing"]
        options["routing"] = package.EMRouting(
            **{f.name: baseline_option(routing, f.name) for f in dataclasses.fields(package.EMRouting)}
        )
        weights = net.state_dict()
        with package.active():
            net = package.MatrixCapsNet(
                in_channels=2, num_classes=5, image_size=32, **{k: v for k, v in options.items() if k in known}
            )
        net.load_state_dict(weights)
        within = package.active
    optimizer = torch.optim.Adam(net.parameters())  # its rate does not change a step's time

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with within():  # the revision's modules, for what its code imports as it runs
            spread_loss(net(images).scores, targets, 0.2).backward()
        optimizer.step()

    return net, images, step


def compare(batch_size: int, repeats: int, recipe: str, revision: str) -> dict[str, float]:
    """Run in a fresh process: training steps of the net as this tree builds it and as revision's
    package does, with the same weights and batch, interleaved (the shared machine's noise hits both
    alike)."""
    steps = {
        "current": training_step(batch_size, recipe)[2],
        "baseline": training_step(batch_size, recipe, revision)[2],
    }
    times: dict[str, list[float]] = {"current": [], "baseline": []}
    for repeat in range(repeats + 1):  # the first round warms up
        # Alternating which goes first: the second of a pair runs on memory the first just freed.
        for name in ("current", "baseline") if repeat % 2 else ("baseline", "current"):
            with Stopwatch() as watch:
                steps[name]()
            if repeat:
                times[name].append(watch.seconds)
    ratios = [current / baseline for current, baseline in zip(times["current"], times["baseline"], strict=True)]
    return {
        "current_step_s": statistics.median(times["current"]),
        "baseline_step_s": statistics.median(times["baseline"]),
        "median_ratio": statistics.median(ratios),
        "ratio_quartiles": statistics.quantiles(ratios, n=4)[::2],
    }


def peak_rss(batch_size: int, recipe: str, revision: str | None) -> float:
    """Run in a fresh process: the peak RSS (GiB) of training steps of the net as revision's package
    builds it (None: this tree), counted from after the net is built (VmHWM reset)."""
    _, _, step = training_step(batch_size, recipe, revision)
    reset_peak_rss()
    for _ in range(RSS_STEPS):
        step()
    return peak_rss_gib()


def reset_peak_rss() -> None:
    """Count the peak resident set from here on (not the imports' and the net's)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_gib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE).group(1)) / 2**20


def measure(batch_size: int, repeats: int, recipe: str = "default") -> dict[str, float]:
    """Run in a fresh process: step timings, routing share, peak RSS."""
    from torch.profiler import ProfilerActivity, profile

    import capsexp.nn.matrix_capsules as em_caps_layers
    from capsexp.nn.functional import em_routing

    net, images, step = training_step(batch_size, recipe)
    reset_peak_rss()

    @torch.no_grad()
    def infer() -> None:
        net(images)

    step()  # warm-up
    steps = []
    for _ in range(repeats):
        with Stopwatch() as watch:
            step()
        steps.append(watch.seconds)
    infer()
    inference = []
    for _ in range(repeats):
        with Stopwatch() as watch:
            infer()
        inference.append(watch.seconds)

    peak = peak_rss_gib()  # before the profiler's own memory

    # Routing's share: tag em_routing's forward; its backward nodes are the autograd functions
    # created inside that scope, which the profiler links by sequence number, and every operation
    # run inside them counts too (the vote maker's and the replayed iterations' included).
    original = em_routing

    def tagged(*args, **kwargs):
        with torch.profiler.record_function("em_routing"):
            return original(*args, **kwargs)

    em_caps_layers.em_routing = tagged  # the name the layers call
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    em_caps_layers.em_routing = original
    events = prof.events()
    total = sum(e.self_cpu_time_total for e in events)
    forward_ids = {e.sequence_nr for e in events if e.sequence_nr >= 0 and _under(e, "em_routing")}
    routing = sum(e.self_cpu_time_total for e in events if _under(e, "em_routing") or _in_backward_of(e, forward_ids))
    return {
        "batch_size": batch_size,
        "train_images_per_s": batch_size / statistics.median(steps),
        "train_step_s": statistics.median(steps),
        "inference_images_per_s": batch_size / statistics.median(inference),
        "routing_share": routing / total if total else float("nan"),
        "peak_rss_gib": peak,
    }


def _under(event, name: str) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.cpu_parent
    return False


def _in_backward_of(event, forward_ids: set[int]) -> bool:
    """Whether ``event`` is, or runs inside, the backward node of an operation with one of
    ``forward_ids`` (sequence numbers): the operations a custom autograd function's backward pass
    runs count with it."""
    while event is not None:
        if event.sequence_nr in forward_ids and ("Backward" in event.name or event.name.startswith("autograd::engine")):
            return True
        event = event.cpu_parent
    return False


def accuracy(data_dir: str | None) -> dict[str, float]:
    """Train ACCURACY_STEPS steps through the CLI; test accuracy (full test set) from the event files."""
    return cli_test_accuracy(ACCURACY_COMMAND, "bench_em", data_dir)


def run_worker(name: str, batch_size: int, *options: str) -> dict:
    """One measurement in a fresh process (its peak RSS is its own); its JSON result."""
    command = [sys.executable, __file__, "--worker", str(batch_size), *options]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:  # no page with holes: say what failed, and stop
        sys.exit(f"{name}, batch {batch_size}: the measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


INACTIVE_SHARE, INACTIVE_ACTIVATION, INACTIVE_OFFSET = 0.8, 5e-4, 20.0  # the "inactive far" votes


def float32_errors(recipe: str, spread: float, inactive_far: bool = False, em_routing=None) -> dict[str, float]:
    """em_routing in float32 against float64 on the same ill-conditioned votes (offset 20, the given
    spread; batch 2, 50 children, 8 parents, 16-D poses) under a recipe's routing options: the largest
    error of the poses, activations and responsibilities, and the relative error of the vote gradient.
    ``inactive_far``: most children nearly inactive, voting ``INACTIVE_OFFSET`` away from the active
    ones. ``em_routing``: another routing to measure (default: the working tree's)."""
    if em_routing is None:
        from capsexp.nn.functional import em_routing

    routing = net_options(recipe)["routing"]
    generator = torch.Generator().manual_seed(0)
    votes = 20 + spread * torch.randn(2, 50, 8, 16, generator=generator, dtype=torch.float64)
    activations = torch.rand(2, 50, generator=generator, dtype=torch.float64)
    if inactive_far:
        inactive = torch.arange(50) >= int((1 - INACTIVE_SHARE) * 50)
        activations[:, inactive] = INACTIVE_ACTIVATION
        votes[:, inactive] -= INACTIVE_OFFSET
    beta_u, beta_a = torch.randn(2, 8, generator=generator, dtype=torch.float64)
    upstream = (
        torch.randn(2, 8, 16, generator=generator, dtype=torch.float64),
        torch.randn(2, 8, generator=generator, dtype=torch.float64),
    )
    results = {}
    for dtype in (torch.float64, torch.float32):
        leaf = votes.to(dtype).requires_grad_()
        mu, parent_activations, responsibilities = em_routing(
            leaf, activations.to(dtype), beta_u.to(dtype), beta_a.to(dtype), routing, return_responsibilities=True
        )
        (grad,) = torch.autograd.grad((mu, parent_activations), leaf, [u.to(dtype) for u in upstream])
        results[dtype] = [t.detach().double() for t in (mu, parent_activations, responsibilities, grad)]
    exact, single = results[torch.float64], results[torch.float32]
    return {
        "poses": (single[0] - exact[0]).abs().max().item(),
        "activations": (single[1] - exact[1]).abs().max().item(),
        "responsibilities": (single[2] - exact[2]).abs().max().item(),
        "vote_gradient": ((single[3] - exact[3]).norm() / exact[3].norm()).item(),
    }


def float64_on_rounded_inputs(votes, activations, beta_u, beta_a, routing, **options):
    """em_routing in float64 on inputs given in float32: their rounding is then the only error, the
    floor no float32 routing can go below (float32_errors measures it as another routing)."""
    from capsexp.nn.functional import em_routing

    inputs = (votes, activations, beta_u, beta_a)
    outputs = em_routing(*(t.double() if t.dtype == torch.float32 else t for t in inputs), routing, **options)
    return tuple(t.to(votes.dtype) for t in outputs)


def median_rss(results: list[dict]) -> float:
    return statistics.median(result["peak_rss_gib"] for result in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--accuracy", action="store_true", help=f"also train {ACCURACY_STEPS} MNIST steps via the CLI")
    parser.add_argument("--data-dir", default=None, help="data dir for --accuracy (default: paths.data_dir)")
    parser.add_argument(
        "--recipes",
        nargs="+",
        choices=list(RECIPES),
        default=list(RECIPES),
        help="model=em_caps (default) and/or model=em_caps_paper",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also compare with the net as git revision REV's src/ builds it (same weights), interleaved",
    )
    parser.add_argument(
        "--baseline-name",
        metavar="TEXT",
        help="what the baseline revision is, for the page (e.g. 'the routing before <change>'; default: REV)",
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-recipe", default="default", help=argparse.SUPPRESS)
    parser.add_argument(
        "--worker-task", choices=["measure", "compare", "rss"], default="measure", help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.worker:
        if args.worker_task == "compare":
            result = compare(args.worker, args.repeats, args.worker_recipe, args.baseline)
        elif args.worker_task == "rss":
            result = {"peak_rss_gib": peak_rss(args.worker, args.worker_recipe, args.baseline)}
        else:
            result = measure(args.worker, args.repeats, args.worker_recipe)
        print(json.dumps(result))
        return
    if args.baseline and args.repeats < 2:
        parser.error(f"--repeats must be at least 2 with --baseline (the page gives quartiles), got {args.repeats}")

    load_at_start = os.getloadavg()[0]
    rows, baseline_rows = [], []
    for recipe in args.recipes:
        for batch_size in args.batch_sizes:
            name = f"model={RECIPES[recipe]}"
            common = ("--repeats", str(args.repeats), "--worker-recipe", recipe)
            result = run_worker(name, batch_size, *common)
            rows.append(
                f"| {name} | {batch_size} | {result['train_images_per_s']:.2f} | {result['train_step_s']:.2f} s | "
                f"{result['inference_images_per_s']:.2f} | {100 * result['routing_share']:.0f}% | "
                f"{result['peak_rss_gib']:.2f} GiB |"
            )
            if args.baseline:
                side_by_side = run_worker(
                    name, batch_size, *common, "--worker-task", "compare", "--baseline", args.baseline
                )
                # Peak RSS varies by tens of MB between identical processes: medians of alternating ones.
                rss, baseline_rss = [], []
                for _ in range(RSS_PROCESSES):
                    for runs, baseline in ((rss, ()), (baseline_rss, ("--baseline", args.baseline))):
                        runs.append(run_worker(name, batch_size, *common, "--worker-task", "rss", *baseline))
                low, high = side_by_side["ratio_quartiles"]
                baseline_rows.append(
                    f"| {name} | {batch_size} | {side_by_side['current_step_s']:.3f} s | "
                    f"{side_by_side['baseline_step_s']:.3f} s | {side_by_side['median_ratio']:.3f} "
                    f"({low:.3f} to {high:.3f}) | {median_rss(rss):.3f} GiB | {median_rss(baseline_rss):.3f} GiB |"
                )
    cpu = cpu_name()
    text = "\n".join(
        [
            "# EM capsules (MatrixCapsNet) benchmark",
            "",
            f"Written by `experiments/bench_em_caps.py` on {datetime.date.today()}: {cpu}, "
            f"{torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''}, torch {torch.__version__}.",
            "A=B=C=D=32, K=3, 4x4 poses, 2x32x32 inputs, 5 classes, Adam; each model config's own routing options "
            f"({'; '.join(recipe_text(recipe) for recipe in RECIPES)});",
            f"medians of {args.repeats} steps; each row in its own process. On a shared machine step times vary",
            "between runs (by up to 40% seen here): compare the rows of one page, not figures across pages.",
            f"Load average (1 minute) when the timings began and ended: {load_at_start:.2f} and "
            f"{os.getloadavg()[0]:.2f}, on {os.cpu_count()} cores (this benchmark alone adds about 1: above that,",
            "other work shared the machine).",
            "",
            "| recipe | batch | training images/s | training step | inference images/s "
            "| routing share of the step | peak RSS |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
        ]
    )
    precision_rows = []
    routings = {"this tree": None, "float64, inputs rounded": float64_on_rounded_inputs}
    if args.baseline:
        routings["baseline"] = baseline_routing(args.baseline)
    for recipe in args.recipes:
        for inactive_far in (False, True):
            for spread in (0.01, 0.03):
                for routing_name, routing in routings.items():
                    errors = float32_errors(recipe, spread, inactive_far, routing)
                    precision_rows.append(
                        f"| model={RECIPES[recipe]} | {'inactive far' if inactive_far else 'all'} | {spread} | "
                        f"{routing_name} | {errors['poses']:.1e} | {errors['activations']:.1e} | "
                        f"{errors['responsibilities']:.1e} | {errors['vote_gradient']:.1e} |"
                    )
    text += "\n" + "\n".join(
        [
            "## float32 against float64",
            "",
            "`em_routing` on the same votes in float32 and in float64, under each recipe's routing options: votes",
            "20 + spread x N(0, 1) (far from zero compared with their spread; batch 2, 50 children, 8 parents,",
            "16-D poses). Largest absolute error of the poses, activations and responsibilities; relative error",
            "(norm) of the gradient of the votes under random upstream gradients. Children: all with",
            f"activations drawn from U(0, 1), or, inactive far, {INACTIVE_SHARE:.0%} of them with activation "
            f"{INACTIVE_ACTIVATION:g} voting",
            f'{INACTIVE_OFFSET:g} lower than the active ones. Routing "float64, inputs rounded": float64 on the',
            "inputs rounded to float32, whose rounding is then the only error: the floor of any float32 routing."
            + (" Baseline: the em_routing of the revision compared below." if args.baseline else ""),
            "",
            "| recipe | children | spread | routing | poses | activations | responsibilities | vote gradient |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |",
            *precision_rows,
            "",
        ]
    )
    if args.baseline:
        baseline_name = args.baseline_name or f"`{args.baseline}`"
        command = ["python", "experiments/bench_em_caps.py", "--batch-sizes", *map(str, args.batch_sizes)]
        command += ["--repeats", str(args.repeats), "--recipes", *args.recipes, "--baseline", "REV"]
        output = args.output.resolve()
        if output != RESULTS.resolve():  # relative where it can be: the page outlives this machine
            command += [
                "--output",
                str(output.relative_to(PROJECT_ROOT) if output.is_relative_to(PROJECT_ROOT) else output),
            ]
        text += "\n" + "\n".join(
            [
                f"## This tree's EM routing against {baseline_name}",
                "",
                f"`{' '.join(command)}`, REV being {baseline_name}: the net as src/ at REV builds it",
                "against the working tree's, with the same weights and batch; training steps interleaved in one",
                f"process (which goes first alternating), medians of {args.repeats} each; the ratio is this tree's",
                "step over the baseline's",
                "(median of the paired ratios, quartiles in brackets: below 1 is faster). Peak RSS: each",
                f"in processes of its own ({RSS_STEPS} training steps each, the peak counted from after the net",
                f"is built), the median of {RSS_PROCESSES} alternating ones.",
                "",
                "| recipe | batch | step, this tree | step, baseline | ratio "
                "| peak RSS, this tree | peak RSS, baseline |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
                *baseline_rows,
                "",
            ]
        )
    if args.accuracy:
        acc = accuracy(args.data_dir)
        text += "\n" + "\n".join(
            [
                "## Accuracy (MNIST, fixed number of steps)",
                "",
                f"`python -m capsexp {' '.join(ACCURACY_COMMAND)}`: {ACCURACY_STEPS} steps of batch 16 under the",
                "default recipe of model=em_caps, then the full 10,000-image test set.",
                "",
                "| test accuracy | wall time |",
                "| ---: | ---: |",
                f"| {100 * acc['test_acc']:.2f}% | {acc['wall_s'] / 60:.1f} min |",
                "",
            ]
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""Every constructor option reaches the code it controls, generated from the signatures.

For each option of each net, capsule layer, routing-options object (through the layer whose router it
makes) and DataModule, the object is built at its base value and at another allowed value (derived
from the option's type: a bool flipped, another member of a Literal, an int one larger, ...) and what
it computes is compared: for a module its forward outputs, the gradients of its parameters and input
and its parameters' shapes; for a DataModule the first batch of each loader as the net receives it,
the loaders' settings and the splits' sizes, or the error it raises. An option dropped on its way down
(the layer then runs on its own default) gives equal fingerprints and fails here. A new option is
covered without a new test; one that changes nothing observable goes in ``NO_EFFECT`` or
``DATA_NO_EFFECT`` with the reason (strict xfails: an entry whose option comes to matter fails too).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from capsexp.config.routing_options import Routing
from capsexp.config.routing_registry import built_in
from capsexp.models import BaselineCNN, CapsNet, LeNet5, MatrixCapsNet
from capsexp.nn import (
    ClassMatrixCapsules,
    ConvMatrixCapsules,
    EMRouting,
    PrimaryCapsules,
    PrimaryMatrixCapsules,
    ResNetStem,
    RoutingCapsules,
)

UNSET = inspect.Parameter.empty
ROUTINGS = built_in()  # capsexp's own, whatever else is installed


def alternatives(annotation: Any, default: Any) -> list[Any]:
    """Allowed values other than ``default``, from the option's type hint."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return [a for a in args if a != default]
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if all(dataclasses.is_dataclass(a) for a in members):  # a routing: each other algorithm
            return [m() for m in members if not isinstance(default, m)]
        if default is None:  # Optional[X] left unset: one value of X
            return [next(iter(alternatives(members[0], None)), None)]
        found = []
        for member in members:  # each member's values that fit the default (an int, or a pair of ints)
            try:
                found += [v for v in alternatives(member, default) if v != default and v not in found]
            except (TypeError, ValueError):
                continue
        return found[:2]
    if annotation is bool:
        return [value for value in (True, False) if value != default]
    if annotation is int:
        if not (default is None or isinstance(default, int)):
            raise TypeError(f"{default!r} is not an int")
        return [1 if default is None else default + 1]
    if annotation is float:  # halved: inside an upper bound (a probability, a ratio) as well as a lower
        # 0.3 where unset: not a value a None commonly stands for (0.5 = 1/sqrt(4), 0.01, 1e-4)
        return [0.3 if default is None else default / 2 if default else 0.5]
    if origin is tuple or origin is Sequence or annotation in (tuple, Sequence):
        if not (default is None or isinstance(default, (tuple, list))):
            raise TypeError(f"{default!r} is not a sequence")
        if default is None or len(default) == 0:
            return [tuple(next(iter(alternatives(args[0], None)), None) for _ in range(1))] if args else []
        return [tuple(v * 2 if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in default)]
    if isinstance(annotation, type) and issubclass(annotation, Routing):  # a routing: each other built-in one
        kinds = {type(o): o for o in built_in().values() if not isinstance(o, type(default))}
        return list(kinds.values())
    if dataclasses.is_dataclass(annotation):  # its fields are varied in the routing-options tests
        return []
    raise TypeError(f"no alternative value derived for an option of type {annotation!r}")


def options(target: Callable) -> dict[str, tuple[Any, Any]]:
    """``{name: (annotation, default)}`` of ``target``'s keyword options (required ones left out)."""
    init = target.__init__ if isinstance(target, type) and not dataclasses.is_dataclass(target) else target
    hints = typing.get_type_hints(init)
    if dataclasses.is_dataclass(target):
        return {f.name: (hints[f.name], f.default) for f in dataclasses.fields(target)}
    return {
        name: (hints.get(name, type(p.default)), p.default)
        for name, p in inspect.signature(target).parameters.items()
        if p.default is not UNSET
    }


def fingerprint(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """What ``module`` computes on ``inputs``, in training mode with the same random draws: each output
    tensor, the gradient of their sum for every parameter and float input, and each parameter's shape."""
    inputs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    torch.manual_seed(0)
    module.train()
    output = module(*inputs)
    flat = [t for t in (output if isinstance(output, (tuple, list)) else [output]) if isinstance(t, torch.Tensor)]
    found = {f"output{i}": t.detach() for i, t in enumerate(flat)}
    total = sum(t.float().sum() for t in flat if t.requires_grad)
    if torch.is_tensor(total):
        total.backward()
    found |= {f"shape {n}": torch.tensor(p.shape) for n, p in module.named_parameters()}
    found |= {f"grad {n}": p.grad for n, p in module.named_parameters() if p.grad is not None}
    found |= {f"grad input{i}": x.grad for i, x in enumerate(inputs) if x.grad is not None}
    return found


def differ(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    if first.keys() != second.keys():
        return True
    return any(
        a.shape != b.shape or not torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-7, equal_nan=True)
        for a, b in ((first[k], second[k]) for k in first)
    )


@dataclasses.dataclass
class Subject:
    """An object to build at each option's values: its base options, the inputs it takes given its
    options, and how to make it from them (the class itself unless said otherwise)."""

    target: Callable
    base: dict[str, Any]
    inputs: Callable[[dict[str, Any]], list[torch.Tensor]]
    make: Callable[..., torch.nn.Module] | None = None
    prepare: Callable[[torch.nn.Module], None] | None = None  # run after building, before computing

    def build(self, **changed: Any) -> torch.nn.Module:
        torch.manual_seed(0)
        built = (self.make or self.target)(**(self.base | changed))
        if self.prepare:
            with torch.no_grad():
                self.prepare(built)
        return built


def images(channels: int = 1, size: int = 28) -> Callable[[dict[str, Any]], list[torch.Tensor]]:
    def make(kwargs: dict[str, Any]) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(1)
        side = kwargs.get("image_size", size)
        side = side if isinstance(side, int) else side[0]
        return [torch.rand(3, kwargs.get("in_channels", channels), side, side, generator=generator)]

    return make


def tensors(*shape_of: Callable[[dict[str, Any]], tuple[int, ...]]) -> Callable[[dict[str, Any]], list[torch.Tensor]]:
    def make(kwargs: dict[str, Any]) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(1)
        return [torch.rand(*shape(kwargs), generator=generator) for shape in shape_of]

    return make


def scale_votes(net: torch.nn.Module) -> None:
    for name, parameter in net.named_parameters():
        if name in ("digits.weight", "weight"):  # CapsNet's DigitCaps W_ij, a RoutingCapsules' own
            parameter.mul_(300)


SMALL_CAPSNET = {"conv_channels": 8, "primary_types": 2, "primary_dim": 4, "pose_dim": 4}
SMALL_MATRIX = {"conv_channels": 8, "primary_types": 2, "conv_caps1_types": 2, "conv_caps2_types": 2}
SUBJECTS = {
    "LeNet5": Subject(LeNet5, {}, images()),
    "BaselineCNN": Subject(BaselineCNN, {"conv_layers": (8, 8, 4), "hidden_sizes": (16, 8)}, images()),
    # At its initialisation (W_ij of std 0.01) CapsNet's votes are about 1e-6 and their agreements 1e-12:
    # every routing's couplings stay uniform to float precision, so routing options show no effect until
    # the votes grow. W_ij scaled up so that they do, as training makes them.
    "CapsNet": Subject(CapsNet, SMALL_CAPSNET, images(), prepare=scale_votes),
    "MatrixCapsNet": Subject(MatrixCapsNet, SMALL_MATRIX, images()),
    "PrimaryCapsules": Subject(PrimaryCapsules, {"in_channels": 4, "num_types": 2, "dim": 4}, images(4, 20)),
    "RoutingCapsules": Subject(
        RoutingCapsules,
        {"in_caps": 6, "in_dim": 4, "out_caps": 3, "out_dim": 5},
        tensors(lambda k: (3, 6, 4)),
        prepare=scale_votes,
    ),
    "PrimaryMatrixCapsules": Subject(PrimaryMatrixCapsules, {"in_channels": 4, "num_types": 2}, images(4, 6)),
    "ConvMatrixCapsules": Subject(
        ConvMatrixCapsules,
        {"in_types": 2, "out_types": 2},
        tensors(lambda k: (3, 2, k.get("pose_size", 4) ** 2, 7, 7), lambda k: (3, 2, 7, 7)),
    ),
    "ClassMatrixCapsules": Subject(
        ClassMatrixCapsules,
        # in_positions: the 3 x 3 map's, so that a router with per-child parameters can be built
        {"in_types": 2, "num_classes": 3, "in_positions": 9},
        tensors(lambda k: (3, 2, k.get("pose_size", 4) ** 2, 3, 3), lambda k: (3, 2, 3, 3)),
    ),
    "ResNetStem": Subject(ResNetStem, {"in_channels": 1, "channels": 4}, images(1, 12)),
}

# Options that change nothing these fingerprints can see, and why.
NO_EFFECT: dict[tuple[str, str], str] = {
    ("ClassMatrixCapsules", "in_positions"): "it sizes a router with parameters per child; EM routing has none",
}


def cases() -> list[Any]:
    found = []
    for name, subject in SUBJECTS.items():
        for option, (annotation, default) in options(subject.target).items():
            base = subject.base.get(option, default)
            for value in alternatives(annotation, base):
                marks = (
                    [pytest.mark.xfail(reason=NO_EFFECT[name, option], strict=True)]
                    if (name, option) in NO_EFFECT
                    else []
                )
                found.append(pytest.param(name, option, value, id=f"{name}.{option}={value!r}", marks=marks))
    return found


@pytest.mark.parametrize("name,option,value", cases())
def test_each_option_of_each_net_and_layer_changes_what_it_computes(name, option, value):
    subject = SUBJECTS[name]
    base = subject.build()
    changed = subject.build(**{option: value})
    assert differ(
        fingerprint(base, subject.inputs(subject.base)),
        fingerprint(changed, subject.inputs(subject.base | {option: value})),
    ), f"{name}({option}={value!r}) computes what {name}'s base options do: the option does not reach its code"


# Each routing's options, in the layer that routes by them: EM's in the matrix capsules (one of them,
# route_per_window, is the convolutional layer's, as VB's is), the others in a fully connected capsule layer.
def routing_cases() -> list[Any]:
    found = []
    for routing, base in ROUTINGS.items():
        for option, (annotation, _) in options(type(base)).items():
            for value in alternatives(annotation, getattr(base, option)):
                found.append(pytest.param(routing, option, value, id=f"{routing}.{option}={value!r}"))
    return found


@pytest.mark.parametrize("routing,option,value", routing_cases())
def test_each_option_of_each_routing_changes_what_its_layer_computes(routing, option, value):
    base = ROUTINGS[routing]
    matrix = isinstance(base, EMRouting) or option == "route_per_window"
    subject = SUBJECTS["MatrixCapsNet" if matrix else "RoutingCapsules"]
    inputs = subject.inputs(subject.base)
    first = fingerprint(subject.build(routing=base), inputs)
    second = fingerprint(subject.build(routing=dataclasses.replace(base, **{option: value})), inputs)
    assert differ(first, second), f"routing={routing} with {option}={value!r} routes as without it"


# ---- DataModules: each option reaches the batches (training batches augmented as in training) ---------
DATA_BASE = {"batch_size": 8, "verify_checksums": False, "download": False}
DATA_SUBJECTS = {  # the class, where its files are (under the shared data dir), its base options
    "MNISTDataModule": ("MNIST", {**DATA_BASE, "val_size": 60, "canvas": 32}),
    "FashionMNISTDataModule": ("FashionMNIST", {**DATA_BASE, "val_size": 60, "canvas": 32}),
    "MultiMNISTDataModule": ("MNIST", {**DATA_BASE, "val_size": 60}),
    "SmallNORBDataModule": ("smallnorb", {**DATA_BASE, "val_size": 12, "viewpoint": "azimuth"}),
    "CIFAR10DataModule": ("cifar-10-batches-py", {**DATA_BASE, "val_size": 12}),
    "SVHNDataModule": ("svhn", {**DATA_BASE, "val_size": 12}),
    "ImageFolderDataModule": ("folder", {"batch_size": 8}),
}
# Options whose values are places, not derived from a type: another one that holds no data.
PLACES = {"data_dir": "nowhere", "root": "nowhere", "base_url": "http://127.0.0.1:9/"}
# Options (or one value of one) that change nothing these batches show, and why.
DATA_NO_EFFECT = {
    "download": "acts only when a file is missing (tests/test_mnist_data.py, tests/test_smallnorb.py: downloads)",
    "base_url": "read only to download a missing file (tests/test_smallnorb.py: downloads)",
    "on_device=False": "what on_device=auto chooses on a CPU",
    "brightness": "the per-image standardisation after it removes an offset added to every pixel",
    "ImageFolderDataModule.data_dir": "where the decoded images are cached, not where they are read",
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory):
    from tests.helpers import write_image_folder, write_mnist, write_norb
    from tests.test_colour_data import write_cifar, write_svhn

    root = tmp_path_factory.mktemp("data")
    write_mnist(root, train=120, test=40)
    write_mnist(root, train=120, test=40, folder="FashionMNIST")
    write_norb(root)
    write_cifar(root)
    write_svhn(root)
    write_image_folder(root / "folder", per_class=12, size=(20, 24))
    return root


def batches(make: Callable[[], Any]) -> dict[str, Any]:
    """What a DataModule gives: the size of each split, its loaders' settings and types, and the first
    batch of each loader as the net receives it (training ones augmented as at step 0); or the error."""
    from tests.helpers import FakeTrainer

    try:
        datamodule = make()
        datamodule.trainer = FakeTrainer()
        datamodule.prepare_data()
        found: dict[str, Any] = {}
        for stage, splits in (("fit", ("train", "val")), ("test", ("test",))):
            datamodule.setup(stage)
            for split in splits:
                datamodule.trainer.training, datamodule.trainer.testing = split == "train", split == "test"
                loaders = getattr(datamodule, f"{split}_dataloader")()
                for i, loader in enumerate(loaders if isinstance(loaders, list) else [loaders]):
                    torch.manual_seed(0)
                    iterator = iter(loader)
                    images, targets, *_ = datamodule.on_after_batch_transfer(next(iterator), i)
                    # A persistent worker process stopped now: left to the garbage collector, it takes 5 s.
                    if hasattr(iterator, "_shutdown_workers"):
                        iterator._shutdown_workers()
                    found |= {f"{split}{i} images": images, f"{split}{i} targets": targets}
                    settings = [getattr(loader, a, None) for a in ("batch_size", "num_workers", "pin_memory")]
                    found[f"{split}{i} loader"] = (type(loader).__name__, len(loader), *settings)
        return found
    except Exception as error:  # an option that makes the data fail is an option that reached it
        return {"error": f"{type(error).__name__}: {error}"}


def data_differ(first: dict[str, Any], second: dict[str, Any]) -> bool:
    if first.keys() != second.keys():
        return True
    tensors_ = {k for k in first if isinstance(first[k], torch.Tensor)}
    return differ({k: first[k] for k in tensors_}, {k: second[k] for k in tensors_}) or any(
        first[k] != second[k] for k in first.keys() - tensors_
    )


def data_cases() -> list[Any]:
    import capsexp.data

    found = []
    for name, (_, base) in DATA_SUBJECTS.items():
        for option, (annotation, default) in options(getattr(capsexp.data, name)).items():
            values = [PLACES[option]] if option in PLACES else alternatives(annotation, base.get(option, default))
            for value in values:
                keys = (option, f"{option}={value!r}", f"{name}.{option}")
                reason = next((DATA_NO_EFFECT[k] for k in keys if k in DATA_NO_EFFECT), None)
                marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
                found.append(pytest.param(name, option, value, id=f"{name}.{option}={value!r}", marks=marks))
    return found


@pytest.mark.parametrize("name,option,value", data_cases())
def test_each_option_of_each_datamodule_changes_its_batches(data_dir, name, option, value):
    import capsexp.data

    target = getattr(capsexp.data, name)
    folder, base = DATA_SUBJECTS[name]
    base = base | ({"root": data_dir / folder} if name == "ImageFolderDataModule" else {}) | {"data_dir": data_dir}
    value = data_dir / value if option in ("data_dir", "root") else value
    first = batches(lambda: target(**base))
    assert "error" not in first, first
    second = batches(lambda: target(**(base | {option: value})))
    assert data_differ(first, second), f"{name}({option}={value!r}) gives the batches of {name}'s base options"

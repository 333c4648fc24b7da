"""Write the real MNIST as an image folder, to check ``data=image_folder`` against ``data=mnist``.

The PNGs go to ``<output>/{train,val,test}/<digit>/<index>.png`` (``--output``, by default
``<data dir>/mnist_image_folder``, where the experiment looks): the training and
validation images of ``data=mnist``'s own split (its ``data.val_size`` and ``data.split_seed``) and the
official test images, each written losslessly as it is stored (28x28 grey), so that both configs train
and test on the same pixels. ``experiment=mnist_as_image_folder`` then compares them.

    python experiments/mnist_image_folder.py          # about a minute; into the data dir the runs use
    python experiments/mnist_image_folder.py --output data/mnist_image_folder   # elsewhere: then pass
    python -m capsexp -m experiment=mnist_as_image_folder study=quick image_folder_root=data/mnist_image_folder
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from PIL import Image

from capsexp.config import hydra_setup
from capsexp.config.instantiation import instantiate
from capsexp.data import MNISTDataModule

log = logging.getLogger("capsexp")
FOLDER = "mnist_image_folder"  # under the data dir: the experiment's data.root reads it from there


def write_split(images, targets, folder: Path) -> None:
    for index, (image, target) in enumerate(zip(images, targets.tolist(), strict=True)):
        path = folder / str(target) / f"{index:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0].numpy()).save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="where MNIST is read (default: the data dir the config resolves)")
    parser.add_argument("--output", help=f"where the folder is written (default: <data dir>/{FOLDER})")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = hydra_setup.compose(["data=mnist"] + ([f"paths.data_dir={args.data_dir}"] if args.data_dir else []))
    datamodule: MNISTDataModule = instantiate("data", cfg.data)
    datamodule.prepare_data()
    datamodule.setup()
    output = Path(args.output) if args.output else Path(cfg.paths.data_dir) / FOLDER
    for split, dataset in (
        ("train", datamodule.data_train),
        ("val", datamodule.data_val),
        ("test", datamodule.data_test),
    ):
        log.info(f"{output / split}: writing {len(dataset):,} PNGs")
        write_split(dataset.images, dataset.targets, output / split)
    print(output)


if __name__ == "__main__":
    main()

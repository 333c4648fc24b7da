"""Screenshots of TensorBoard over a mixed logs/ folder, for docs/running.md#tensorboard.

Runs ``python -m capsexp -m model=lenet5,capsnet_small seed=1,2`` and two single runs of
``python -m capsexp model=capsnet_small model/routing=uniform seed=1`` that differ in their length
(``trainer.limit_train_batches=60`` and ``30``) on MNIST (a short epoch; 20 validation and test batches)
into one logs/ folder, serves it as ``make tensorboard`` does
(``python -m capsexp.tensorboard``), and photographs the Time Series tab as it opens (the accuracy
cards pinned), the Images and the HParams dashboards with headless Chromium (Debian's ``chromium``
package: ``apt-get install chromium``) into ``docs/images/tensorboard_<dashboard>.png``. Rerun it when
what the runs log changes:

    python experiments/tensorboard_screenshots.py                # sweep, serve, photograph
    python experiments/tensorboard_screenshots.py --logdir DIR   # photograph runs already made
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from capsexp.tensorboard import url

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

OUTPUT = PROJECT_ROOT / "docs" / "images"
SHORT = [
    "data=mnist",
    "trainer.max_epochs=1",
    "trainer.val_check_interval=30",
    "trainer.limit_val_batches=20",
    "trainer.limit_test_batches=20",
    "callbacks.progress_bar=null",
]
LAUNCHES = [
    ["-m", "model=lenet5,capsnet_small", "seed=1,2", *SHORT, "trainer.limit_train_batches=60"],
    ["model=capsnet_small", "model/routing=uniform", "seed=1", *SHORT, "trainer.limit_train_batches=60"],
    ["model=capsnet_small", "model/routing=uniform", "seed=1", *SHORT, "trainer.limit_train_batches=30"],
]
# The dashboards photographed: file name -> the address's tail after the host (capsexp.tensorboard.url's
# for the first view, with its charts drawn as SVG: headless Chromium has no WebGL, and drew none).
FIRST_VIEW, _, TAB = url(0).split("/", 3)[3].partition("#")
DASHBOARDS = {
    "scalars": f"{FIRST_VIEW}&forceSVG=true#{TAB}",
    "images": "#images",
    "hparams": "#hparams",
}
WINDOW = (1600, 1000)  # pixels
RENDER_MS = 20_000  # the page's own time to load its data and draw, in Chromium's virtual time


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve(logdir: Path, port: int) -> subprocess.Popen:
    """``make tensorboard``'s server on ``logdir``, once it answers (a minute at most)."""
    command = [sys.executable, "-m", "capsexp.tensorboard", str(logdir), "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit(f"TensorBoard did not answer on port {port} within a minute")


def photograph(url: str, target: Path, browser: str) -> None:
    width, height = WINDOW
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # root in a container has no sandbox to enter
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            f"--virtual-time-budget={RENDER_MS}",
            f"--screenshot={target}",
            url,
        ],
        check=True,
        capture_output=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logdir", type=Path, help="runs to show (default: run the sweep into a temporary folder)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--browser", default="chromium")
    args = parser.parse_args()
    browser = shutil.which(args.browser)
    if browser is None:
        raise SystemExit(f"{args.browser} not found: install it (Debian: apt-get install chromium) or give --browser")
    with tempfile.TemporaryDirectory() as scratch:
        logdir = args.logdir
        if logdir is None:
            logdir = Path(scratch) / "logs"
            for launch in LAUNCHES:
                print("python -m capsexp " + " ".join(launch), flush=True)
                subprocess.run([sys.executable, "-m", "capsexp", *launch, f"paths.log_dir={logdir}"], check=True)
        port = free_port()
        server = serve(logdir, port)
        try:
            args.output.mkdir(parents=True, exist_ok=True)
            for name, fragment in DASHBOARDS.items():
                target = args.output / f"tensorboard_{name}.png"
                photograph(f"http://127.0.0.1:{port}/{fragment}", target, browser)
                print(f"wrote {target}")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()

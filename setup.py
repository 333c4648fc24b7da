"""The one build step pyproject.toml cannot declare: the top-level ``conf/`` (Hydra's configs, where the
layout keeps them beside ``src/``) copied into the built package as ``capsexp/conf/``, so that a wheel, or
``pip install .``, composes configs from any folder (``capsexp.locations.CONFIG_DIR``). An editable install
reads the checkout's ``conf/`` in place, so nothing is copied for it."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONFIGS = Path(__file__).resolve().parent / "conf"
# The routings' verdicts the reference pages found, for the model cards of an installed package's runs
# (capsexp.records.verdicts): experiments/results/<page>/verdicts.json -> capsexp/verdicts/<page>.json.
RESULTS = Path(__file__).resolve().parent / "experiments" / "results"


class BuildWithConfigs(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        if not CONFIGS.is_dir():  # an sdist without conf/ would build a package that composes nothing
            raise SystemExit(f"error: {CONFIGS} not found: the package needs capsexp's configs")
        packaged = Path(self.build_lib) / "capsexp" / "conf"
        shutil.rmtree(
            packaged, ignore_errors=True
        )  # a config since removed from conf/ must not linger from an earlier build
        for source in sorted(CONFIGS.rglob("*.yaml")):
            target = packaged / source.relative_to(CONFIGS)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(source), str(target))
        verdicts = Path(self.build_lib) / "capsexp" / "verdicts"
        shutil.rmtree(verdicts, ignore_errors=True)
        for source in sorted(RESULTS.glob("*/verdicts.json")):
            verdicts.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(source), str(verdicts / f"{source.parent.name}.json"))


setup(cmdclass={"build_py": BuildWithConfigs})

"""The configs of packages that register a routing: each one's ``conf/`` folder on Hydra's search path, after
capsexp's own (:func:`capsexp.config.routing_registry.config_folders`), so that ``experiment=<its study>``
composes as capsexp's studies do. Hydra finds search path plugins only in the ``hydra_plugins`` namespace."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from capsexp.config.routing_registry import config_folders


class RoutingPackagesSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for package, folder in config_folders().items():
            search_path.append(provider=package, path=f"file://{folder}")

"""Configuration: the type hints that are the schema (:mod:`~capsexp.config.arguments`), the routing
options (:mod:`~capsexp.config.routing_options`), what Hydra composes with
(:mod:`~capsexp.config.hydra_setup`), the command-line checks before it composes
(:mod:`~capsexp.config.command_line`) and the check of the composed config
(:mod:`~capsexp.config.config_check`). Importing the package imports none of them: the nets import the
routing options without Hydra."""

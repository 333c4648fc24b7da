"""Lightning callbacks of a capsexp run: checkpoints, progress lines, epoch timing, capsule figures and
routing diagnostics (``conf/callbacks/``)."""

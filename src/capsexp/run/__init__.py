"""What runs a job: the config check, building and training (``train.run``), multi-process runs,
checkpoints given on the command line, resuming and SLURM restarts, the hyperparameters logged."""

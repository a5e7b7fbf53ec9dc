"""The training side of xtrain: config, tasks (workloads), the Accelerate loop, checkpoints."""

"""Starting processes: accelerate configs, the worker launcher, rendezvous, lifetime, stops, SLURM."""

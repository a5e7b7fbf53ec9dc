"""A process's life, on both sides of a launch: ``signals.py`` (Ctrl+C/SIGTERM, exit codes),
``report.py`` (what a worker tells its launcher), ``lifetime.py`` (workers die with their
launcher), ``process_group.py`` (joining the spawn rendezvous), ``lock.py`` (one run per output
folder), ``quiet.py`` (library noise)."""

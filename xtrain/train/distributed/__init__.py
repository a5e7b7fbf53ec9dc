"""What several processes need in the loop: ``accelerator.py`` (the Accelerator from the plan and
the settings), ``collective.py`` (what ranks agree on), ``comm_hook.py`` (gradients through CPU
copies), ``sharded.py`` (FSDP2/ZeRO-3 weights gathered, written once), ``cuda_settings.py`` (TF32)."""

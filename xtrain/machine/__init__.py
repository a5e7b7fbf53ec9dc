"""Machine facts: what this machine is and can do (plain data), and the probes that collect them."""

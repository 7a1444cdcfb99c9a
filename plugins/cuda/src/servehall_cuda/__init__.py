"""servehall-cuda: NVIDIA GPUs through torch and the shared torch engine."""

"""servehall-rocm: AMD GPUs through torch's ROCm/HIP build and the shared torch engine."""

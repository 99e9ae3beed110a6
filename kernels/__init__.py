"""kernels: fast paths with reference fallbacks, their gates and probes.

Metal and CUDA sources go through `mx.fast.metal_kernel` / `mx.fast.cuda_kernel`; every fast
path has a reference implementation and a gate saying when it may dispatch, and counts its
dispatches so a cell can prove it ran. May import: mlx, numpy.
"""

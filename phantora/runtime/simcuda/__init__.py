"""The simulated CUDA device: CUDA + NCCL programs run unchanged on a CPU-only torch build.

- guard.cc / guard.py: the C++ device guard and CUDA hooks, built once (native.py) and loaded before torch;
- fastpath.py, _fastop.c, compiled.py: an op's common case, in Python and compiled; tensorinfo.cc: its tensors'
  metadata read from C++ (built once by native.py);
- preload.py: loads them first thing in a rank process (bootstrap, fork server);
- device.py: `install`, the switch that turns the simulated device on in a rank;
- api.py: `torch.cuda` as the simulated GPU answers it; streams.py: streams and events;
- tensor.py: `SimCudaTensor`, cuda tensors whose data is a CPU (real) or meta (phantom) tensor.

This package's ``__init__`` imports nothing, so that preload.py runs before torch is imported.
"""

#!/usr/bin/env bash
# Built at stop 69, never run (the device time ran out): where_masked on the GPU (fillRowsBackwardKernel
# reads it). GpuAttention but cuDNN's tests, from pack gpuV (tools/bench/pack.sh gpuV
# build/tests/gpu_tests, rebuilt from the tree). On the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/gpuV.tar.xz && bash tools/bench/stop69_where.sh
# If it passes, the CUDA target can take where_masked (compiler/target.cpp, cudaAttention).
exec bash "$(dirname "${BASH_SOURCE[0]}")/stop69_suite.sh" 'GpuAttention.*:-GpuAttention.Cudnn*'

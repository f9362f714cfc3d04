#!/usr/bin/env bash
# Stop 70, one GPU call for both of stop 69's unrun checks, from pack gpuW (gpu_tests built at 2ed108f
# with results/2026-12-07i-h100/bwd_wg128.patch, so it holds where_masked's GPU cases too):
#   rm -rf .gpu; tar -xJf .gpuz/gpuW.tar.xz && bash tools/bench/stop70_call1.sh
# 1. GpuAttention but cuDNN's with the patch (wgmma backward at head 128 too);
# 2. the cases holding where_masked (ForwardAndBackward, OperandsInPlace) again under AMPC_ATTENTION_BWD_MMA_SYNC=1 (the mma.sync
#    backward), so a failure there tells the patch from where_masked;
# 3. the bench at the Llama and GPT-2 shapes, wgmma against mma.sync backward, alternating.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
run_gpu_tests 150 'GpuAttention.*:-GpuAttention.Cudnn*'
mv $R/gpu_tests.txt $R/gpu_tests_wg.txt
AMPC_ATTENTION_BWD_MMA_SYNC=1 run_gpu_tests 90 'GpuAttention.ForwardAndBackward*:GpuAttention.OperandsInPlace*'
mv $R/gpu_tests.txt $R/gpu_tests_sync.txt
bash "$bench/stop70_bwd_wg128.sh" bench

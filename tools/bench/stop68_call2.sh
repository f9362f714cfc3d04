#!/usr/bin/env bash
# Stop 68's second GPU call (it never ran: no machine came; for the next stop): the committed tree (the head-64 wgmma forward in two stages at four
# blocks a SM) through the whole GPU suite and attn_bench. Pack gpuS: gpu_tests, attn_bench and ampc
# (GpuFused's kernels come from it): tools/bench/pack.sh gpuS build/tests/gpu_tests
# build/tools/attn_bench build/tools/ampc; on the GPU machine (carry .gpuz/gpuS.tar.xz):
#   rm -rf .gpu; tar -xJf .gpuz/gpuS.tar.xz && bash tools/bench/stop68_call2.sh
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
R=$OUT
cp /tmp/r/gpu.txt $R/ 2>/dev/null
AMPC_BIN=$(command -v ampc) timeout 200 gpu_tests > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|rc=" $R/gpu_tests.txt | head -30; grep -E "Failure" -A6 $R/gpu_tests.txt | head -20
timeout 30 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
echo "# Llama shape" >> $R/attn_bench.txt
timeout 60 attn_bench --bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
grep -E "#|bf16" $R/attn_bench.txt

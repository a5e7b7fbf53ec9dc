#!/usr/bin/env bash
# The checks a lent GPU runs first, most telling first, each under its own time limit, so a short
# loan still brings back whole files: the GPU suite file by file, then the GPU benchmarks.
# Logs and JSON go to $OUT (the device tool's folder) or ./gpu-out; summary.txt has one line a step.
#
#   bash benchmarks/gpu_session.sh            # everything (about 12 minutes on an H100)
#   bash benchmarks/gpu_session.sh tests      # the GPU suite only
#
# On a machine without this project's packages, wheels in .whl/ (python -m pip download ... -d .whl)
# are installed into /tmp/site first, without the network.
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /dev/null
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)" >> "$out/gpu.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...: the command's output in NAME.log, its exit code in summary.txt
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout -s INT "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc $((SECONDS - started))s $(tail -n 1 "$out/$name.log")" | tee -a "$out/summary.txt"
}
suite() { step "$1" "$2" python3 -m pytest -q -n 0 -p no:cacheprovider -rA --tb=short "tests/gpu/$1.py"; }

suite test_quantized_layers_gpu 60    # one bitsandbytes layer against its dequantized weight: seconds
suite test_gradients_gpu 240          # every CUDA training path against the plain reference
suite test_levers_gpu 180             # activation offloading, the chunked loss under bf16
suite test_cuda 300                   # each precision trains, the estimate, TF32, torchrun
suite test_lora_variants_gpu 150
suite test_optim_8bit_gpu 150
suite test_fsdp_gpu 300
suite test_decoding_gpu 300           # GRPO's decode: static cache and compiled step, a GRPO run
[ "${1:-all}" = tests ] && exit 0

step chunked_loss 240 python3 benchmarks/chunked_loss.py --device cuda --json
step grpo_decode_0.5b 300 python3 benchmarks/grpo_decode.py --device cuda --size 0.5b --json
step grpo_decode_512 180 python3 benchmarks/grpo_decode.py --device cuda --size 512 --json
step chunked_loss_7b 300 python3 benchmarks/chunked_loss.py --device cuda --size 7b
step gpu_rows 600 python3 benchmarks/gpu.py --steps 30 --json
step loops_fp16 300 python3 benchmarks/loops.py --size base --precision fp16 --repeats 5

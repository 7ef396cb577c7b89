#!/usr/bin/env bash
# Llama-3.1-8B widths, vocabulary and context with 4 of its 32 layers, 4w, against llama.cpp's Q4_0 GGUF of
# the same shape (untied output), one call; then what the device's out-of-memory error looks like.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl1b/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp PYTHONPATH=/tmp/site
mkdir -p /tmp/m8 /tmp/lc
M=/tmp/m8/llama3_1_8b_synthetic_4layers_4w_ctx2048.pte
t0=$(date +%s.%N)
[ -f $M ] || cat /tmp/parts/part_* | xz -T16 -dc > $M
G=/tmp/m8/llama8b4-q4_0.gguf
[ -f $G ] || xz -T16 -dc .b8/run/llama8b4-q4_0.gguf.xz > $G
[ -x /tmp/lc/llamacpp-bin/llama-bench ] || xz -dc .peers/llamacpp/bin/llamacpp-bin.tar.xz | tar -x -C /tmp/lc
ls -la $M $G; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
peer() {
timeout 150 /tmp/lc/llamacpp-bin/llama-bench -m $G -ngl 99 -fa 0,1 -p 512,2048 -n 128 -r 2 -o json > $OUT/lc_bench_$1.json 2>$OUT/lc_bench_$1.log; echo "llama-bench rc=$?"
timeout 150 /tmp/lc/llamacpp-bin/llama-batched-bench -m $G -ngl 99 -fa on -c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,16,32,64 \
  --output-format jsonl 2>$OUT/lc_batched_$1.log | grep '^{' > $OUT/lc_batched_$1.jsonl; echo "batched rc=$?"
python3 - $OUT $1 <<'PY'
import json, sys
rows = {}
for run in json.load(open(f"{sys.argv[1]}/lc_bench_{sys.argv[2]}.json")):
    key = f"prefill_{run['n_prompt']}" if run["n_gen"] == 0 else "decode_1"
    rows[key] = max(rows.get(key, 0), run["avg_ts"])
for line in open(f"{sys.argv[1]}/lc_batched_{sys.argv[2]}.jsonl"):
    run = json.loads(line); rows[f"batched_{run['pl']}"] = run["speed_tg"]
print("llama.cpp", {k: round(v) for k, v in sorted(rows.items())})
PY
}
peer 1
timeout 240 python3 examples/bench_llm.py $M --params .b8/run/llama3_1_8b_synthetic_4layers_4w_ctx2048.json --runs 2 --sessions 1,16,32,64 \
  --batched-only --no-torch --json $OUT/ours.json > $OUT/ours.log 2>&1; echo "ours rc=$?"
python3 -c "
import json; r=json.load(open('$OUT/ours.json'))['wgpu']
print('ours', {k: (round(v, 3) if isinstance(v, float) and v < 10 else round(v)) if isinstance(v, (int, float)) else v for k, v in r.items()})" 2>/dev/null || tail -20 $OUT/ours.log
peer 2
timeout 90 python3 examples/profile_ragged_decode.py $M 1 2>&1 | grep -v Warn | tail -14
timeout 90 python3 examples/profile_ragged_decode.py $M 1 --whole-steps 2>&1 | grep -v Warn | tail -2
timeout 90 python3 examples/profile_prefill.py $M 512,2047 2>&1 | grep -v Warn | tail -32
python3 - <<'PY'
import time, numpy as np, wgpu
a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
d = a.request_device_sync(required_limits=dict(a.limits))
n, U = 1 << 30, wgpu.BufferUsage
src = d.create_buffer(size=n, usage=U.STORAGE | U.COPY_DST | U.COPY_SRC)
dst = d.create_buffer(size=n, usage=U.STORAGE | U.COPY_DST | U.COPY_SRC)
data = np.ones(n // 4, np.float32)
for i in range(3):
    t = time.perf_counter(); d.queue.write_buffer(src, 0, data); d.queue.read_buffer(src, 0, 4); up = time.perf_counter() - t
    enc = d.create_command_encoder(); enc.copy_buffer_to_buffer(src, 0, dst, 0, n)
    t = time.perf_counter(); d.queue.submit([enc.finish()]); d.queue.read_buffer(dst, 0, 4); cp = time.perf_counter() - t
    print(f"write_buffer 1 GiB {n / up / 1e9:.2f} GB/s; device copy 1 GiB {2 * n / cp / 1e9:.0f} GB/s (read + write)")
src.destroy(); dst.destroy()
PY

set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
for v in quads after; do [ -d /tmp/w_$v ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/w_$v .pk/whl/*.whl .pk/ab/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m; [ -f /tmp/m/llama1b_4w.pte ] || xz -T16 -dc .pk/models/llama1b_4w.pte.xz > /tmp/m/llama1b_4w.pte
for v in quads after; do PYTHONPATH=/tmp/w_$v python3 results/h200/kernel_choices/q4_split_k/check.py /tmp/m/llama1b_4w.pte /tmp/$v.npz 2>&1 | grep -v Warn; done
python3 -c "
import numpy as np
a, b = np.load('/tmp/quads.npz'), np.load('/tmp/after.npz')
for k in ('prompt', 'step'):
    x, y = a[k], b[k]
    print(k, x.shape, 'max |diff| / max |logit|', np.abs(x - y).max() / np.abs(x).max(), 'argmax', x.reshape(-1, x.shape[-1]).argmax(-1)[-3:], y.reshape(-1, y.shape[-1]).argmax(-1)[-3:])"
PYTHONPATH=/tmp/w_after python3 results/h200/kernel_choices/q4_wide_subgroup_fold/alone.py /tmp/m/llama1b_4w.pte 2,16 2>&1 | grep -v Warn

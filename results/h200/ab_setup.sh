# Sourced by the A/B scripts here, on the device machine, from the checkout's root: the Vulkan loader
# from .gl/, the two versions' wheels in $1/before and $1/after installed with .whl1b's into
# /tmp/w_before and /tmp/w_after, the NVIDIA ICD, and the GPU's name and driver.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
for v in before after; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/w_$v .whl1b/*.whl $1/$v/*.whl 2>&1 | tail -1
done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
